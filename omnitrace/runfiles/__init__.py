"""The run directory's I/O (docs/run-directory.md): one home for its file names
(:mod:`.names`), the readers that check what they read (:mod:`.read`, field types in
:mod:`.fieldtypes`), the writers and the one read-modify-write of run.json
(:mod:`.write`), and who may use a directory (:mod:`.claim`). The event log
(``events/``) is ``omnitrace.eventlog``'s; ``profiles/`` is written by
``omnitrace.profile.finalize`` and its index read here."""
