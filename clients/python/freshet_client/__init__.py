"""A client for freshet serve (docs/http.md in the freshet repository).

    from freshet_client import Client
    c = Client("http://127.0.0.1:8080", model="fashion")
    w = c.latest()                      # Weights: version, epoch, tensors
    p = c.infer(x)                      # Prediction: probabilities, argmax
    w = c.wait_next(w.version, 30)      # the next version, or None

Standard library and numpy; torch only for load_torch().
"""

from freshet_client.client import Client, Delta, FreshetError, Prediction, Weights

__all__ = ["Client", "Delta", "FreshetError", "Prediction", "Weights"]
