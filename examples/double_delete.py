"""A buggy DLPack consumer: it releases a tensor twice.

`dlproducer` exports a 1-d float32 tensor through a "dltensor" capsule;
`dlconsumer.double_delete` takes it correctly (renames the capsule to
"used_dltensor") and then calls the tensor's deleter twice -- the classic
double free of DLPack bridges (dlpack issue #39, pytorch #9261).

Natively glibc aborts somewhere inside free() with no hint of which Python
line did it. Under capsan you get the Python line of both deleter calls and
of the export:

    make demo
    # or, by hand, after `make && make fixtures`:
    PYTHONPATH=build/tests build/bin/capsan run -- /usr/bin/python3 examples/double_delete.py
"""
import dlconsumer
import dlproducer


def load_batch(n):
    return dlproducer.good(n)  # the producer: a correct "dltensor" capsule


def consume(capsule):
    # the bug: this consumer calls mt->deleter(mt) twice
    return dlconsumer.double_delete(capsule)


batch = load_batch(1024)
total = consume(batch)
print(f"sum of the batch: {total}", flush=True)
