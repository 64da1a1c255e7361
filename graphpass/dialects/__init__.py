"""What differs per format, behind one protocol (``base.Dialect``): op kinds
(stateful, random, variable updates), dtypes, shape inference, and the builders
of the small ops passes insert; and, as the dialect's ``step``
(``base.StepStructure``), the training step as the format writes it (optimizer
applies, the step counter, what the step is fed and returns). ``tf`` and ``onnx``
implement them (``tf_step``, ``onnx_step``); passes are written once against them."""
