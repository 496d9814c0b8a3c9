/*
 * keys.c - the key layout of docs/design.md "Redis layout": every key of model m
 * is "freshet:{m}:<suffix>", so that the hash tag {m} keeps all of them on
 * one Redis Cluster slot and one MULTI/EXEC can cover them.
 *
 * Model names are checked (psstore_model_name_check: at most 64 bytes of
 * [A-Za-z0-9._-]) before they reach these functions, so every key fits in
 * PS_KEY_MAX bytes; a longer one would be truncated, never overflow.
 */
#include <stdio.h>

#include "psstore/store/store_int.h"

void ps_key(char *key, const char *model, const char *suffix)
{
    snprintf(key, PS_KEY_MAX, "freshet:{%s}:%s", model, suffix);
}

void ps_key_shard(char *key, const char *model, const char *what, long long k)
{
    snprintf(key, PS_KEY_MAX, "freshet:{%s}:%s:%lld", model, what, k);
}

void ps_shard_tag(char *tag, const char *model, int k, int S)
{
    if (S <= 1)
        snprintf(tag, PS_TAG_MAX, "%s", model);
    else
        snprintf(tag, PS_TAG_MAX, "%s/s%d", model, k);
}
