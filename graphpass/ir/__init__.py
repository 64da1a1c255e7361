"""The IR: one ``Graph`` over a networkx multigraph (``Node``, ``Tensor`` edges with
ports, control edges) and its invariants (``verify``). Nothing here knows a format,
a runtime or a pass; what differs per format lives in ``graphpass.dialects``
(``ir.dialects`` holds the table each format registers itself in).

Modules: ``graph`` (``Graph``: state, edits, orders; re-exports the names below),
``edges`` (the edge reads), ``order`` (topological orders), ``node`` (``Node``,
``Attrs``), ``names`` (``Tensor``, name uniquifying), ``collector`` (``gc_paused``),
``verify`` (the invariant checker)."""
