"""The doors into the user's own code: ``lmprof run`` (script.py, ranks.py for ``--nproc``) and
``lmprof.profile()`` (context.py); their loop drives the steps, the protocol's session observes
(pipeline/protocol). See docs/user-code.md."""
