"""The data plane: moves tuples between tasks and never blocks on the coordinator.

transport.py        mutually authenticated long-lived streams between workers, a MAC on every frame
guard.py            connections from anyone bounded in number and time
grouping.py         Storm's groupings: which task(s) of a bolt get a tuple
compute.py          the worker's resizable pool of compute threads
executor.py         the loop around one spout or bolt instance
inbox.py            a bolt's queue, with an overflow for what other workers sent past it
delivery.py         local queues, links to peers, holds: backpressure per task
acker.py            the XOR ledger of a spout's tuple trees, and their expiry
routing.py          pure: an inbound message and a view of the assignment -> what to do with it
fencing.py          task instances own their state by version; a superseded one stops
topology_runtime.py one topology's share of one worker
"""
