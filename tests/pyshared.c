/* A shared-libpython interpreter: Debian's /usr/bin/python3 links libpython
 * statically, so symbol interposition alone never sees its PyCapsule_* calls.
 * This launcher (linked with -lpython3.11 by the Makefile) runs the same
 * site-packages through libpython3.11.so, the other build capsan must serve. */
#include <Python.h>

int main(int c, char **v)
{
    return Py_BytesMain(c, v);
}
