# BUILD-file macros (pants.toml: build_file_prelude_globs), loaded before every BUILD file.

# The GPU machine's Python: the `gpu` resolve (CUDA torch, vLLM, verl) is locked for it.
GPU_PYTHON = ("CPython==3.12.*",)


def gpu_python_sources(name="gpu", **kwargs):
    """The directory's sources again, in the `gpu` resolve (CPython 3.12), for the GPU trainer.

    A second target over the same files rather than `parametrize(resolve=...)`: the copy needs
    other interpreter constraints, and the tag keeps it out of `::` on CPU machines (CI).
    """
    python_sources(  # noqa: F821  (a BUILD symbol: Pants puts it into the prelude's namespace)
        name=name,
        resolve="gpu",
        interpreter_constraints=GPU_PYTHON,
        tags=["gpu"],
        **kwargs,
    )
