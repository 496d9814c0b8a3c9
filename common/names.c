/*
 * names.c - the character set of names: model names and Kafka topics.
 */
#include "common/common.h"

int fr_name_char(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}
