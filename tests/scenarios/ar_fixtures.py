"""The arrowfx fixture's producer and consumer, one bug per case (argv[1]);
"clean" runs every correct exchange. The line of each export and each
consumer carries a marker the tests look for."""
import sys

import arrowfx as fx


class Frame:
    """A producer object with the dunders, as a dataframe library has."""

    def __init__(self, n=10, bug=""):
        self.n, self.bug = n, bug

    def __arrow_c_array__(self, requested_schema=None):
        return fx.export_array(self.n, self.bug)  # <-- export-array

    def __arrow_c_stream__(self, requested_schema=None):
        return fx.export_stream(3, self.n, self.bug)  # <-- export-stream


class Batch:
    """A record batch of `ncols` columns, as a struct array."""

    def __init__(self, ncols=3, n=10, bug=""):
        self.ncols, self.n, self.bug = ncols, n, bug

    def __arrow_c_array__(self, requested_schema=None):
        return fx.export_batch(self.ncols, self.n, self.bug)  # <-- export-batch


case = sys.argv[1]
if case == "clean":
    assert fx.consume_array(Frame()) == 45
    assert fx.consume_array(Frame(), "borrow") == 45
    assert fx.consume_array(Frame(), "release") == 45
    assert fx.consume_stream(Frame()) == 135
    assert fx.consume_device_array(fx.export_device_array(10)) == 45
    caps = Frame().__arrow_c_array__()
    del caps  # never consumed: its destructor releases it
elif case == "leak":
    fx.consume_array(Frame(), "leak")  # <-- leak
elif case == "double-release":
    fx.consume_array(Frame(), "copy")  # <-- double-release
elif case == "not-cleared":
    fx.consume_array(Frame(bug="not_cleared"), "release")  # <-- not-cleared
elif case == "reconsume":
    cap = Frame().__arrow_c_stream__()
    fx.consume_stream(cap)  # <-- first
    try:
        fx.consume_stream(cap)  # <-- reconsume
    except ValueError:
        pass
elif case == "use-after-release":
    fx.consume_stream(Frame(), "stale_copy")  # <-- use-after-release
elif case == "stream-misuse":
    fx.consume_stream(Frame(bug="barrier"), "threads")  # <-- stream-misuse
elif case == "renamed":
    fx.consume_array(Frame(), "rename")  # <-- renamed
elif case == "no-dtor":
    caps = Frame(bug="no_dtor").__arrow_c_array__()
    del caps  # <-- no-dtor
elif case == "empty":
    import arrowsink  # another library's consumer: the capsule is handed over
    arrowsink.consume_array(Frame(bug="empty"), "borrow")  # <-- empty
elif case == "bad-device":
    fx.consume_device_array(fx.export_device_array(10, "no_device_type"))  # <-- bad-device
elif case == "bad-name":
    # a library written against the interface's first draft: every consumer
    # asking for the exact names fails; said once per name and call site
    for _ in range(3):
        try:
            fx.consume_array(Frame(bug="draft_names"))  # <-- bad-name
        except ValueError:
            pass
elif case == "bad-name-twin":
    for _ in range(3):
        assert fx.consume_array(Frame()) == 45
elif case == "child-leak":
    assert fx.consume_array(Batch(3, bug="off_by_one")) == 135  # <-- child-leak
elif case == "moved-child-leak":
    assert fx.consume_array(Batch(3), "move_column_leak") == 45  # <-- moved-child-leak
elif case.startswith("staged-"):
    # a loader that stages a batch, keeping column 0 it moved out, and
    # releases the batch later: the column is moved at the staging line
    assert fx.stage_batch(Batch(3)) == 45  # <-- staged-move
    fx.flush_staged(case[len("staged-"):])  # <-- staged-flush
elif case == "child-leak-twin":
    assert fx.consume_array(Batch(3)) == 135
    assert fx.consume_array(Batch(3), "move_column") == 45  # column 0 moved out first
    assert fx.consume_array(Batch(2), "borrow") == 90
    caps = Batch(4).__arrow_c_array__()
    del caps  # never consumed: its destructor releases it
print("done")
