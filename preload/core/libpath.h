/* What the runtime finds beside itself: the libraries it dlopen()s, found
 * there first, and the report tool.
 * A wheel from `make wheel` ships its own libunwind in lib/capsan.libs/
 * next to lib/libcapsan.so (.ci/wheel_repair.py), so that a machine without
 * Debian's libunwind8 still gets native stacks and one that has it never
 * mixes the two; a build from source (make, pip install .) has no such
 * directory and loads the system's by soname. */
#ifndef CAPSAN_LIBPATH_H
#define CAPSAN_LIBPATH_H

/* The file name the wheel gives its libunwind (also its soname, so that no
 * other library in the process binds to it as libunwind.so.8). */
#define CS_BUNDLED_UNWIND "libunwind-capsan.so.8"

/* dlopen(mode) libunwind: the bundled copy by path when it exists (and then
 * only that one), else libunwind.so.8. The same call with RTLD_NOLOAD finds
 * the copy an earlier call loaded. */
void *cs_libunwind_open(int mode);

/* The report tool beside the runtime, PREFIX/bin/capsan for
 * PREFIX/lib/libcapsan.so (build/, make install, the wheel): "" when
 * there is none. Found once (the first call allocates nothing after). */
const char *cs_cli_path(void);

#endif
