/*
 * The counter-based generators of base/rng.h: Philox-4x32-10 against the
 * known-answer vectors its authors publish with Random123 (kat_vectors:
 * counter, key, the 128 bits out), and the key a stream of dropout's
 * draws is made of (base_philox_key: the seed as the key, the words as
 * the counter).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/rng.h"

static void test_philox_known_answers(void **state)
{
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        base_philox4x32(kat[i].ctr, kat[i].key, out);
        for (int w = 0; w < 4; w++)
            if (out[w] != kat[i].out[w])
                fail_msg("vector %zu, word %d: got %08x, want %08x", i, w, out[w], kat[i].out[w]);
    }
}

static void test_key_is_the_seed_folded_with_the_words(void **state)
{
    (void)state;
    const uint64_t seed = 0x299f31d0a4093822ull; /* the third vector's key, low word first */
    const uint32_t words[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    uint32_t key[2];
    base_philox_key(seed, words, key);
    assert_int_equal(key[0], 0xd16cfe09);
    assert_int_equal(key[1], 0x94fdcceb);
    /* Each word moves the key. */
    for (int w = 0; w < 4; w++) {
        uint32_t other[4], moved[2];
        memcpy(other, words, sizeof other);
        other[w] ^= 1;
        base_philox_key(seed, other, moved);
        assert_true(moved[0] != key[0] || moved[1] != key[1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_key_is_the_seed_folded_with_the_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
