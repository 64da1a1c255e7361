"""The edges of the pipeline: format detection by content, ``load``/``save`` and
atomic output (``detect``), and the readers/writers: TF GraphDef, MetaGraphDef and
SavedModel (``tf_io``) with function bodies (``tf_library``), and ONNX (``onnx_io``).
A read-then-write with no pass is lossless."""
