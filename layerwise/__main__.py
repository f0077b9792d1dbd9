"""`python -m layerwise ...` is the `layerwise` command, for an interpreter whose scripts folder
is not on PATH (a `pip install --target` folder, a GPU machine's own Python):

    python -m layerwise train resnet18 --strategy data --nproc 1 --image-size 224
"""

from layerwise.flows.cli import main

main()
