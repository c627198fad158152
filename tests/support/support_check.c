/* Comparing float arrays in tests (see support_check.h). */
#include "support_check.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

bool test_close_enough(const char *what, const float *got, const float *want, int64_t n,
                       double atol, double rtol)
{
    int64_t worst = -1;
    double worst_ratio = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double ratio = d / (atol + rtol * fabs((double)want[i]));
        if (!(ratio <= worst_ratio) || worst < 0) { /* NaN counts as worst */
            worst_ratio = ratio;
            worst = i;
        }
    }
    if (n > 0 && !(worst_ratio <= 1.0)) {
        print_error("%s: element %lld of %lld: got %.9g, want %.9g (|diff| %.3g, allowed %.3g)\n",
                    what, (long long)worst, (long long)n, got[worst], want[worst],
                    fabs((double)got[worst] - want[worst]), atol + rtol * fabs(want[worst]));
        return false;
    }
    return true;
}
