/*
 * The classes of code points GPT-2's pre-tokenizer regex tells apart:
 * letters (\p{L}), numbers (\p{N}), white space (JavaScript's \s) and the
 * rest.  The table (unicode_class.c) is generated from Node's regex engine
 * by scripts/gen-unicode-classes.js.
 */
#ifndef SPMD_TOOLS_UNICODE_CLASS_H
#define SPMD_TOOLS_UNICODE_CLASS_H

#include <stdint.h>

typedef enum unicode_class {
    UNICODE_OTHER,
    UNICODE_LETTER,
    UNICODE_NUMBER,
    UNICODE_SPACE
} unicode_class;

unicode_class unicode_class_of(uint32_t cp);

#endif
