/*
 * common.h - the one public header of freshet's common module: error codes,
 * logging, clocks, a seeded random generator, configuration, the metrics
 * registry and a generic safetensors reader/writer.
 *
 * Depends on libc only. Thread safety is stated per section below.
 */
#ifndef FRESHET_COMMON_H
#define FRESHET_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FR_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
/* A function the CUDA module takes from the program that loads it (the
 * build hides every other symbol; cuda/exports.list exports these). */
#define FR_MODULE_API __attribute__((visibility("default")))
/* C11's _Noreturn, spelled so that nvcc (C++) reads this header too. */
#define FR_NORETURN __attribute__((noreturn))
#else
#define FR_PRINTF(fmt, args)
#define FR_MODULE_API
#define FR_NORETURN _Noreturn
#endif

/* A hot loop over a parameter vector, compiled also for AVX2 and chosen at
 * load time (GCC function multiversioning on x86-64), so the portable
 * binary still runs at the width of the CPU it lands on. Not under
 * ThreadSanitizer: the chooser (an ifunc resolver) runs before its runtime
 * is up and would crash the program at load. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define FR_VECTOR_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define FR_VECTOR_LOOP
#endif

/* ------------------------------------------------------------------------
 * Errors. Functions that can fail return one of these; constructors return
 * NULL and fill an errstr buffer instead.
 * ---------------------------------------------------------------------- */
typedef enum fr_err {
    FR_OK = 0,
    FR_ERR_INVAL = -1,       /* bad argument, option or configuration value */
    FR_ERR_NOMEM = -2,       /* allocation failed */
    FR_ERR_IO = -3,          /* file or socket I/O failed */
    FR_ERR_PARSE = -4,       /* malformed input: file, record, request */
    FR_ERR_RANGE = -5,       /* a value outside its allowed range */
    FR_ERR_NOTFOUND = -6,    /* no such model, key, file or tensor */
    FR_ERR_EXISTS = -7,      /* the thing already exists */
    FR_ERR_NONFINITE = -8,   /* NaN or infinity where a finite value is needed */
    FR_ERR_UNSUPPORTED = -9, /* valid but not supported by this build */
    FR_ERR_BACKEND = -10,    /* compute backend failure (BLAS, CUDA) */
    FR_ERR_REDIS = -11,      /* Redis error or unreachable */
    FR_ERR_KAFKA = -12,      /* Kafka error or unreachable */
    FR_ERR_TIMEOUT = -13,    /* an operation timed out */
    FR_ERR_STATE = -14,      /* wrong state: lease lost, stopped, closed */
    FR_ERR_AGAIN = -15,      /* busy for now (a full window): try again shortly */
} fr_err_t;

/* A static English description of err; never NULL, also for unknown codes. */
const char *fr_strerror(fr_err_t err);

/* Internal invariants, as SQLite and libuv assert theirs: a condition the
 * code proved, whose failure means a bug that would otherwise corrupt
 * weights or state silently. Never for input, which gets an error and a
 * counter. FR_ASSERT stays on in release builds, for checks that cost a
 * compare; assert() is for ones that cost a loop. A failure logs the
 * condition with its file and line, then aborts. */
#define FR_ASSERT(cond)                                                                            \
    (__builtin_expect(!!(cond), 1) ? (void)0 : fr_assert_fail(#cond, __FILE__, __LINE__))
FR_NORETURN void fr_assert_fail(const char *cond, const char *file, int line);

/* Formats into errstr (when errstr and size are non-zero) and returns err, so
 * that an error can be filled and returned in one statement. */
FR_MODULE_API fr_err_t fr_errorf(fr_err_t err, char *errstr, size_t size, const char *fmt, ...)
    FR_PRINTF(4, 5);

/* ------------------------------------------------------------------------
 * Logging. Lines go to stderr as "2026-11-29T19:00:00.123Z WARN message".
 * Thread-safe: each line is written with one write(2). Warnings and errors
 * are rate limited per call site: at most 10 lines a second each, the next
 * line saying how many were dropped.
 * ---------------------------------------------------------------------- */
typedef enum fr_log_level {
    FR_LOG_ERROR = 0,
    FR_LOG_WARN = 1,
    FR_LOG_INFO = 2,
    FR_LOG_DEBUG = 3,
} fr_log_level_t;

/* The current level (FR_LOG_INFO unless set, or FRESHET_LOG=error|warn|info|debug). */
FR_MODULE_API fr_log_level_t fr_log_level(void);
void fr_log_set_level(fr_log_level_t level);
/* Parses "error", "warn", "info" or "debug"; FR_ERR_INVAL otherwise. */
fr_err_t fr_log_level_parse(const char *name, fr_log_level_t *level);
FR_MODULE_API void fr_log_write(fr_log_level_t level, const char *fmt, ...) FR_PRINTF(2, 3);

/* Tests the level before formatting anything. */
#define fr_log(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= fr_log_level())                                                             \
            fr_log_write((level), __VA_ARGS__);                                                    \
    } while (0)

/* ------------------------------------------------------------------------
 * Clocks. Thread-safe.
 * ---------------------------------------------------------------------- */
uint64_t fr_clock_mono_ns(void); /* CLOCK_MONOTONIC, nanoseconds */
int64_t fr_clock_unix_ms(void);  /* CLOCK_REALTIME, milliseconds since 1970 */
struct timespec;
/* The CLOCK_REALTIME instant ms milliseconds from now, as
 * pthread_cond_timedwait wants it (ms < 0 counts as 0). */
void fr_clock_deadline(struct timespec *ts, int ms);

/* ------------------------------------------------------------------------
 * Memory.
 * ---------------------------------------------------------------------- */
/* Writes every 4 KiB page of p[0..bytes) once, keeping its contents, so
 * that a hot path never pays the first touch of fresh memory (docs/design.md
 * "Performance model": ~11 us a page on these machines). malloc followed by
 * memset may become calloc and touch nothing; this always touches. */
void fr_mem_touch(void *p, size_t bytes);

/* Tells the allocator to keep what it was given: blocks up to 32 MiB come
 * from the heap instead of their own mmap, and freed memory stays mapped
 * (trimmed only past 512 MiB free), so that buffers allocated and freed at
 * a high rate (librdkafka's fetch responses, the consumer's batches, the
 * dev broker's responses) reuse pages already touched. Measured in
 * bench/README.md ("Where the time goes"). Call once, first thing in main. */
void fr_mem_keep(void);

/* Names the calling thread (at most 15 characters are kept), for top -H,
 * perf and gdb. */
void fr_thread_name(const char *name);

/* The cores this process may run on (its affinity mask, which taskset and
 * cgroup cpusets narrow), at least 1. */
int fr_cpu_count(void);

/* ------------------------------------------------------------------------
 * Names.
 * ---------------------------------------------------------------------- */
/* Nonzero for a character of [A-Za-z0-9._-]: the characters of model
 * names and of Kafka topic names (each adds its own length rules). */
int fr_name_char(int c);

/* ------------------------------------------------------------------------
 * Seeded random numbers (xoshiro256** seeded through splitmix64). A
 * generator is a plain struct owned by one thread; the same seed gives the
 * same sequence on every platform.
 * ---------------------------------------------------------------------- */
typedef struct fr_rng {
    uint64_t s[4];
} fr_rng_t;

void fr_rng_seed(fr_rng_t *rng, uint64_t seed);
uint64_t fr_rng_next(fr_rng_t *rng);
/* Uniform in [0, 1) with 53 random bits. */
double fr_rng_uniform(fr_rng_t *rng);
/* Uniform integer in [0, n), unbiased; n > 0. */
uint64_t fr_rng_below(fr_rng_t *rng, uint64_t n);
/* Fisher-Yates shuffle of idx[0..n). */
void fr_rng_shuffle(fr_rng_t *rng, uint32_t *idx, size_t n);

/* The one source of unseeded randomness, for identities that must differ
 * between runs (epochs, lease tokens), never for a seeded sequence. Any
 * thread. fr_random fills p[n] from the kernel (getrandom, else
 * /dev/urandom): FR_OK, or FR_ERR_IO when it gives none. fr_random_u64 is
 * a nonzero 64-bit number from it, else from the clock and the pid. */
fr_err_t fr_random(void *p, size_t n);
uint64_t fr_random_u64(void);

/* FNV-1a of p[0..n) continued from h (FR_FNV1A_SEED to start): a hash for
 * tables keyed by short strings. */
#define FR_FNV1A_SEED 0xcbf29ce484222325ull
uint64_t fr_fnv1a(uint64_t h, const void *p, size_t n);

/* ------------------------------------------------------------------------
 * Layer lists ("784-256-10"), shared by the config schema and the model.
 * ---------------------------------------------------------------------- */
#define FR_LAYERS_MAX 16        /* widths in a list, input and output included */
#define FR_WIDTH_MAX  (1 << 20) /* widest layer */

/* Parses 2..FR_LAYERS_MAX widths in 1..FR_WIDTH_MAX joined by '-' into
 * dims[FR_LAYERS_MAX]; *ndims receives the count. FR_ERR_INVAL with errstr
 * ("model: ...") otherwise. */
fr_err_t fr_layers_parse(const char *list, int *dims, int *ndims, char *errstr, size_t size);

/* ------------------------------------------------------------------------
 * Configuration: one INI file, then "--set section.key=value" overrides,
 * then FRESHET_* environment variables for secrets. Every key of
 * docs/operations.md "Configuration" is known with a type and a default; an unknown
 * key or a bad value is an error naming the file, the line and the key.
 * [kafka] accepts any key and keeps it verbatim, in file order.
 *
 * A config is not thread-safe while it is being modified; once loaded, any
 * number of threads may read it.
 * ---------------------------------------------------------------------- */
typedef struct fr_config fr_config_t;

/* A config holding the default of every key. NULL only if out of memory.
 * Caller frees with fr_config_destroy(). */
fr_config_t *fr_config_new(void);
void fr_config_destroy(fr_config_t *cfg);

/* Reads an INI file over the current values. On error nothing of the file
 * is applied and errstr reads "FILE:LINE: [section] key: why". */
fr_err_t fr_config_load_file(fr_config_t *cfg, const char *path, char *errstr, size_t size);

/* Applies one "section.key=value" assignment (as given to --set). Errors
 * read "--set section.key: why". */
fr_err_t fr_config_set(fr_config_t *cfg, const char *assignment, char *errstr, size_t size);

/* Applies FRESHET_TOKEN (serve.token) and FRESHET_REDIS_URL (redis.url)
 * where set. */
fr_err_t fr_config_apply_env(fr_config_t *cfg, char *errstr, size_t size);

/* The value of a known key as a string (the default when unset). NULL for a
 * key the schema does not know; borrowed until the key is next set. */
const char *fr_config_get(const fr_config_t *cfg, const char *section, const char *key);
/* Typed accessors for keys whose type is int, double or bool. They return 0
 * for unknown keys or keys of another type. */
int64_t fr_config_get_int(const fr_config_t *cfg, const char *section, const char *key);
double fr_config_get_double(const fr_config_t *cfg, const char *section, const char *key);
int fr_config_get_bool(const fr_config_t *cfg, const char *section, const char *key);

/* The schema's default of a key, as a new config holds it: the one place
 * each default is written, so the modules' conf_init functions take theirs
 * from here. No config is needed and these functions can't fail; like the
 * accessors above they return NULL or 0 for an unknown key or a key of
 * another type. */
const char *fr_config_default(const char *section, const char *key);
int64_t fr_config_default_int(const char *section, const char *key);
double fr_config_default_double(const char *section, const char *key);
int fr_config_default_bool(const char *section, const char *key);

/* The [kafka] properties in the order they were given; key and value are
 * borrowed for the life of cfg. */
size_t fr_config_kafka_count(const fr_config_t *cfg);
void fr_config_kafka_at(const fr_config_t *cfg, size_t i, const char **key, const char **value);

/* Writes a commented INI file documenting every key with its default (the
 * source of deploy/freshet.conf.example). */
void fr_config_write_example(FILE *out);

/* ------------------------------------------------------------------------
 * A growable array (mem.c): the one way to grow a malloc'ed array.
 * fr_grow makes room for at least need elements of size elem in *p, whose
 * capacity is *cap: it doubles (from 8) until need fits, so that n appends
 * cost O(n). FR_OK, or FR_ERR_NOMEM (on overflow too) leaving *p and *cap
 * as they were. FR_GROW(p, cap, need) names the element size from p.
 * ---------------------------------------------------------------------- */
fr_err_t fr_grow(void **p, size_t *cap, size_t need, size_t elem);
#define FR_GROW(p, cap, need) fr_grow((void **)&(p), &(cap), (need), sizeof(*(p)))

/* ------------------------------------------------------------------------
 * A growable text buffer (buf.c). Zero-initialise it; the text stays
 * NUL-terminated. A failed allocation sets failed and every later write is
 * dropped, so a writer checks once, when it takes the text. One writer per
 * buffer.
 * ---------------------------------------------------------------------- */
typedef struct fr_buf {
    char *p;
    size_t len, cap;
    int failed; /* an allocation failed: the text is incomplete */
} fr_buf_t;

/* Frees the text; b is empty again. */
void fr_buf_fini(fr_buf_t *b);
/* Empties b for reuse, keeping its memory, and forgets a failure. */
void fr_buf_reset(fr_buf_t *b);
/* Makes room for n more bytes and the NUL. 0, or -1 with failed set. */
int fr_buf_reserve(fr_buf_t *b, size_t n);
void fr_buf_add(fr_buf_t *b, const char *s, size_t len);
void fr_buf_puts(fr_buf_t *b, const char *s);
void fr_buf_printf(fr_buf_t *b, const char *fmt, ...) FR_PRINTF(2, 3);
/* Takes the text (NUL-terminated, also when empty) out of b, which is empty
 * again; the caller frees it. NULL when an allocation failed (b freed).
 * len may be NULL. */
char *fr_buf_take(fr_buf_t *b, size_t *len);

/* Appends s as a JSON string literal, quotes included; the one escaper of
 * the tree (json.c): '"' and '\\' backslashed; control characters, DEL and
 * '<' as \u00XX; well-formed UTF-8 (RFC 3629) kept; each byte of anything
 * else as \ufffd, so the text is valid UTF-8 whatever s holds. */
void fr_json_str(fr_buf_t *b, const char *s);

/* ------------------------------------------------------------------------
 * Metrics registry: counters, gauges and histograms with labels, rendered in
 * the Prometheus text exposition format 0.0.4. Everything here is
 * thread-safe. Families and series live as long as the registry.
 * ---------------------------------------------------------------------- */
typedef struct fr_metrics fr_metrics_t;
typedef struct fr_metric fr_metric_t; /* a family: name, help, type, label names */
typedef struct fr_series fr_series_t; /* one label combination of a family */

#define FR_METRICS_MAX_LABELS 4

fr_metrics_t *fr_metrics_new(void);
void fr_metrics_destroy(fr_metrics_t *reg);

/* Registers a family. Names must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
 * [a-zA-Z_][a-zA-Z0-9_]* (not starting "__"); at most FR_METRICS_MAX_LABELS.
 * Registering an existing name with the same type and labels returns the
 * existing family; otherwise NULL. */
fr_metric_t *fr_metrics_counter(fr_metrics_t *reg, const char *name, const char *help,
                                size_t nlabels, const char *const *label_names);
fr_metric_t *fr_metrics_gauge(fr_metrics_t *reg, const char *name, const char *help, size_t nlabels,
                              const char *const *label_names);
/* bounds: nbounds strictly increasing finite upper bounds; +Inf is implied. */
fr_metric_t *fr_metrics_histogram(fr_metrics_t *reg, const char *name, const char *help,
                                  size_t nbounds, const double *bounds, size_t nlabels,
                                  const char *const *label_names);

/* The series for these label values (nlabels of them, any UTF-8), created on
 * first use. Keep the pointer on hot paths. NULL only if out of memory. */
fr_series_t *fr_metric_series(fr_metric_t *m, const char *const *label_values);

void fr_series_add(fr_series_t *s, double v);     /* counter or gauge */
void fr_series_set(fr_series_t *s, double v);     /* gauge */
void fr_series_observe(fr_series_t *s, double v); /* histogram */
double fr_series_value(fr_series_t *s);           /* counter/gauge value; histogram count */

/* Renders every family in registration order, series in creation order.
 * Returns a NUL-terminated buffer the caller frees with free(); NULL if out
 * of memory. *len (when non-NULL) receives the length without the NUL. */
char *fr_metrics_render(fr_metrics_t *reg, size_t *len);

/* ------------------------------------------------------------------------
 * safetensors (https://github.com/huggingface/safetensors format): an
 * 8-byte little-endian header length, a JSON header (space padded), then the
 * tensor bytes. The writer emits F32, I32 and U32 tensors contiguously from offset 0 in
 * the given order, pads the header to a multiple of 8 and writes string
 * metadata under "__metadata__". The reader validates everything: header
 * length, JSON syntax, dtypes, shapes against byte ranges, holes, overlaps
 * and the exact file size.
 * ---------------------------------------------------------------------- */
#define FR_ST_MAX_DIMS 8

typedef struct fr_st_tensor {
    const char *name;
    char dtype[8]; /* "F32", "F16", "I64", ... as in the file */
    int ndim;
    int64_t shape[FR_ST_MAX_DIMS];
    const void *data; /* little-endian bytes */
    size_t nbytes;
} fr_st_tensor_t;

typedef struct fr_st_kv {
    const char *key;
    const char *value;
} fr_st_kv_t;

/* Encodes tensors (each dtype "F32", "I32" or "U32", data of prod(shape)*4
 * bytes) and
 * metadata into one buffer. On success *out is malloc'ed (caller frees) and
 * *len is its exact size. */
fr_err_t fr_st_encode(const fr_st_tensor_t *tensors, size_t ntensors, const fr_st_kv_t *meta,
                      size_t nmeta, uint8_t **out, size_t *len, char *errstr, size_t size);
/* fr_st_encode, then writes the file atomically (temporary file + rename). */
fr_err_t fr_st_write_file(const char *path, const fr_st_tensor_t *tensors, size_t ntensors,
                          const fr_st_kv_t *meta, size_t nmeta, char *errstr, size_t size);

typedef struct fr_st_file fr_st_file_t;

/* Parses a complete safetensors image of len bytes; the result copies what
 * it needs, so buf may be freed afterwards. NULL with errstr on any
 * malformation. Caller frees with fr_st_destroy(). */
fr_st_file_t *fr_st_parse(const uint8_t *buf, size_t len, char *errstr, size_t size);
/* Reads and parses a file. */
fr_st_file_t *fr_st_read_file(const char *path, char *errstr, size_t size);
void fr_st_destroy(fr_st_file_t *st);

size_t fr_st_count(const fr_st_file_t *st);
/* Tensors in file order (by data offset); borrowed for the life of st. */
const fr_st_tensor_t *fr_st_at(const fr_st_file_t *st, size_t i);
const fr_st_tensor_t *fr_st_find(const fr_st_file_t *st, const char *name);
/* A metadata value or NULL; borrowed for the life of st. */
const char *fr_st_meta(const fr_st_file_t *st, const char *key);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_COMMON_H */
