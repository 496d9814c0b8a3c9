/*
 * fuzz_sparse.c - libFuzzer target for the sparse record layouts
 * (sparse_parse_criteo, sparse_parse_libsvm, sparse_parse_binary).
 *
 * The first input byte chooses the layout (sel % 3: Criteo, libsvm, the
 * binary record) and the table's bits (4 + sel % 27); the rest is the
 * record, copied into a
 * heap buffer of exactly its length, so ASan reports any read past it. On
 * FR_OK the sample must hold at most the fields allowed, rows inside the
 * table, finite values and a 0/1 label; on a refusal the reason must be
 * one of the documented words.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sparse/sparse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int layout = data[0] % 3; /* 0 Criteo, 1 libsvm, 2 binary */
    sparse_spec_t spec = {
        .fields = layout == 1 ? 7 : SPARSE_CRITEO_FIELDS, .bits = 4 + data[0] % 27, .dim = 0};
    size_t len = size - 1;
    char *line = malloc(len > 0 ? len : 1);
    if (line == NULL)
        return 0;
    memcpy(line, data + 1, len);
    sparse_sample_t s;
    const char *why = NULL;
    fr_err_t err = layout == 0   ? sparse_parse_criteo(&spec, line, len, &s, &why)
                   : layout == 1 ? sparse_parse_libsvm(&spec, line, len, &s, &why)
                                 : sparse_parse_binary(&spec, (const uint8_t *)line, len, &s, &why);
    if (err == FR_OK) {
        if (s.n < 0 || s.n > spec.fields || (s.label != 0.0f && s.label != 1.0f))
            abort();
        for (int k = 0; k < s.n; k++)
            if (s.row[k] >= (1u << spec.bits) || !isfinite(s.val[k]))
                abort();
    } else {
        static const char *const reasons[] = {"columns",  "label",  "integer", "index", "value",
                                              "features", "fields", "length",  "field"};
        int known = 0;
        for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
            known |= why != NULL && strcmp(why, reasons[i]) == 0;
        if (err != FR_ERR_PARSE || !known)
            abort();
    }
    free(line);
    return 0;
}
