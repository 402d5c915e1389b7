"""Training runs on disk: start a run, train it, checkpoint it, resume it exactly, report.

The command line (:mod:`numpy_transformer.cli`) parses arguments; everything a run *does*
lives in this package, so it can be driven from Python and tested without a subprocess. Each
module imports only those above it in this list, never one below:

``outputs``
    what a run puts out: the files of a run folder, the exit codes,
    :class:`~.outputs.UsageError` (standard library only: the command line reads it before
    NumPy is loaded)
``options``
    a run's options (:class:`~.options.RunOptions`), the option table of ``train``
    (:data:`~.options.OPTIONS`: the parser, each run's defaults, the checks, what an older
    format lacks) and the tasks (the standard library and the config only, for the same
    reason)
``folder``
    the run folder: choosing it, refusing to overwrite it, its checkpoint and its log
``training_data``
    what a run trains on: the LM's text and its window schedule, or a task's sequences
``state``
    :class:`~.state.Run`, a run in memory, built from options by small functions
``stored``
    a run read back from disk: :func:`~.stored.read_run`, the one way a run folder or
    checkpoint (of any format version read) is read back, the run or its model rebuilt from
    it, and :func:`~.stored.load_run`, the Python loader
``sources``
    a language model from wherever a command points: a run folder, a checkpoint, an export,
    a ``transformers`` folder (:func:`~.sources.read_source`)
``init_from``
    the model a new run starts from (``train --init-from``): its weights, model options and
    tokenizer
``importing``
    a model from elsewhere as a run folder (``numpy-transformer import``)
``sample``
    text from a trained language model (``numpy-transformer sample``)
``evaluate``
    a language model's loss on a text (``numpy-transformer eval``)
``export``
    a trained model for other tools (``numpy-transformer export``)
``report``
    what a run writes after its last step: held-out loss, plots, a sample
``tensorboard``
    ``train --tensorboard``: the log's numbers as TensorBoard events too (tensorboardX,
    optional)
``loop``
    :func:`~.loop.start_run`, :func:`~.loop.resume_run` and the training loop between them

This file imports none of them, so ``import numpy_transformer.runs.options`` stays light.
"""
