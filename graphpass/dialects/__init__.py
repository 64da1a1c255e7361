"""What differs per format, behind one protocol (``base.Dialect``): op kinds
(stateful, random, variable updates, optimizer applies), dtypes, shape inference,
and the builders of the small ops passes insert. ``tf`` and ``onnx`` implement it;
passes are written once against it."""
