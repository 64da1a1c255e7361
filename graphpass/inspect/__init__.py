"""Looking at graphs, never changing them: dumps and Graphviz drawings as pipeline
instruments (``dump``, ``dot``), ``graphpass diff`` (``diff``), ``graphpass verify``
(``equivalence``: training both graphs side by side), ``graphpass inspect``
(``describe``) and the progress line (``progress``)."""
