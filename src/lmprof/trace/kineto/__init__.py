"""The Kineto / Chrome trace JSON reader: a file in, a :class:`~lmprof.trace.table.TraceTable` out.

One job per module, in the order data flows: :mod:`.split` cuts the byte stream into runs of whole
events; each run is decoded into columns by the compiled reader (:mod:`.scan`, ``_scan.c``) when it
accepts it, else by msgspec (:mod:`.decode`, the rule both follow); :mod:`.columns` merges the runs
in file order into the table's frames; :mod:`.load` drives it all (in worker threads or processes
for large files) and :mod:`.heap` sets the heap up for it. Nothing here knows any analysis; the
analyses read the table only (``lmprof.trace.load`` is their door).
"""
