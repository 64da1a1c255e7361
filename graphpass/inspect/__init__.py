"""Looking at graphs: dumps, Graphviz, diff, equivalence runs, describe, progress."""
