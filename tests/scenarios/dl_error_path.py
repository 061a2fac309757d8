"""A producer hands each batch to a callback in a "dltensor" capsule without
a destructor (batchfeed): the callback is to consume it. The callback
refuses the third batch by raising.

argv[1]:
  "leak":  feed() loses its reference to the refused batch's capsule on its
           error path: the capsule object leaks, nothing Python reaches holds
           it, and its tensor is never released (dlpack-leak at its export)
  "retry": feed_keep() keeps the refused capsule in batchfeed.pending, and the
           program consumes it once the queue has room: nothing to report
"""
import sys

import batchfeed as F
import dlconsumer as C

queue = []


def on_batch(cap):
    if len(queue) >= 2:
        raise RuntimeError("queue full")
    queue.append(C.consume_good(cap))


feed = F.feed if sys.argv[1] == "leak" else F.feed_keep
feed(on_batch, 4)
feed(on_batch, 5)
try:
    feed(on_batch, 6)  # <-- refused
except RuntimeError as e:
    print("refused:", e, flush=True)
queue.clear()
while F.pending:
    on_batch(F.pending.pop())
print("deleted", F.deleted_count(), flush=True)
