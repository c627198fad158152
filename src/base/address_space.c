#include "base/address_space.h"

#include <stdio.h>
#include <unistd.h>

size_t base_mapped_bytes(void)
{
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    return (size_t)pages * (size_t)(page > 0 ? page : 4096);
}
