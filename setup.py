"""The one thing pyproject.toml cannot say: the bundled pipelines live in the repository's
pipelines/ folder (the paths the docs and tests use) and ship inside the package as
tracer/pipelines/, so that `tracer run llama_decoder_layer` works wherever the wheel is installed.
Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["tracer*"]), "tracer.pipelines"],
    package_dir={"tracer.pipelines": "pipelines"},
)
