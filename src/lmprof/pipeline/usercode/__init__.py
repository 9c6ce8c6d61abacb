"""Profile the user's own code: their loop drives the steps, a session observes (``lmprof run``,
``lmprof.profile``, the Trainer callback). See docs/user-code.md."""
