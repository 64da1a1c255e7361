"""The IR: one ``Graph`` over a networkx multigraph (``Node``, ``Tensor`` edges with
ports, control edges) and its invariants (``verify``). Nothing here knows a format,
a runtime or a pass; what differs per format lives in ``graphpass.dialects``."""
