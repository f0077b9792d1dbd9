#!/usr/bin/env bash
# The GPU path checked for real on one lent GPU, in one call (about ten minutes for every part):
#
#     bash benchmarks/gpu_check.sh OUT_FOLDER [PART...]   # on the GPU machine, from the checkout
#
# The GPU machine has its own python3 and torch but no pydantic and no network, so the call
# carries wheels in .whl/ (ignored by git): layerwise's own (`.venv/bin/pip wheel --no-deps
# --no-build-isolation -w .whl .`) and pydantic's for that Python (docs/performance.md#one-gpu
# says which). The environment (GPU, torch, CUDA and NCCL versions; layerwise imports on that
# torch) is checked first, then each PART (default: all of them, about ten minutes), each step
# under its own time limit so one slow step cannot hide the others' results:
#   runtime  the runtime on NCCL with one process: ResNet-18 trained under `data`, its measured
#            step against the device model's prediction (--analytic) and against a profile of
#            the same tiles taken with CUDA events (`layerwise profile --device cuda`);
#   memory   peak memory: the caching allocator's peak against strategies/cost/memory.py's
#            prediction (benchmarks/bench_memory.py, one process, 224x224), and recompute's
#            price in memory and time, measured and predicted (benchmarks/bench_recompute.py);
#   devicemodel  the device model's error per op kind against CUDA-event profiles of every
#            tile of every config on 4 devices (benchmarks/device_model_check.py), 2-d models;
#   nd       the same for the 1-d and 3-d zoo (M5, CosmoFlow, the 3-d U-Net: Conv1d/3d, their
#            pools, ConvTranspose3d, skip concatenation), and each of them profiled with CUDA
#            events and trained on NCCL with one process against both predictions;
#   dense    the 3-d U-Net scoring every voxel (unet3d_seg) on the generated segments dataset:
#            profiled with CUDA events, trained on NCCL with one process against both
#            predictions;
#   dispatch the host's floor under a tile (benchmarks/host_dispatch.py: per layer and per op
#            forward and backward, one launch); tiles timed alone as the profile times them
#            against the same tiles back to back (benchmarks/tile_overlap.py: ResNet-18 and
#            torchvision's MobileNetV3, EfficientNet, ConvNeXt and RegNet); and tiny_cnn at 32 px
#            and 2 images, where every layer is host-bound, trained on NCCL with one process;
#   library  the machine's own torchvision builders (MobileNetV3, EfficientNet, ConvNeXt,
#            ShuffleNetV2, RegNet; others named in $BUILDERS) profiled on the GPU and trained
#            on NCCL with one process.
# Several processes on one GPU cannot share NCCL (it refuses two ranks on one device), so the
# multi-process runtime and `calibrate --backend nccl` need a machine with one GPU per process.

set -u
OUT=$(realpath -m "${1:-gpu-check}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$REPO"/.whl/*.whl || { echo "wheels did not install"; exit 2; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# not the checkout: its layerwise/ folder holds only the namespace's top (the build maps the rest)
WORK=$(mktemp -d) && cd "$WORK" || exit 2

nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'NCCL', torch.cuda.nccl.version(), torch.cuda.get_device_name())" || exit 3
python3 -c "import layerwise.strategies.runtime.worker, layerwise.flows.cli" || exit 3
case "$(python3 -c 'import torch; print(torch.cuda.get_device_name())')" in
    *H200*) CLUSTER=h200x8 ;;
    *) CLUSTER=h100x8 ;;
esac

step() {  # step LIMIT_S COMMAND...: run it, say how it ended and how long it took
    local limit=$1 started=$SECONDS
    shift
    echo "== $* (limit ${limit} s)"
    timeout "$limit" "$@"
    echo "== exit $? after $((SECONDS - started)) s"
}

PARTS=("${@:2}")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(runtime memory devicemodel nd dense dispatch library)

trained() {  # trained NAME MODEL_ARGS...: CUDA-event profile, then one-process NCCL runs
    local name=$1
    shift
    step 90 python3 -m layerwise profile "$@" --devices 1 --device cuda \
        --out "$OUT/profile-$name.json"
    step 60 python3 -m layerwise train "$@" --strategy data --nproc 1 --steps 20 \
        --cluster "$CLUSTER" --analytic --out "$WORK/$name-analytic"
    step 60 python3 -m layerwise train "$@" --strategy data --nproc 1 --steps 20 \
        --cluster "$CLUSTER" --profile "$OUT/profile-$name.json" --out "$WORK/$name-profiled"
    cp "$WORK/$name-profiled/result.json" "$OUT/train-$name.json" 2>/dev/null
}

for part in "${PARTS[@]}"; do
    echo "#### $part"
    case $part in
    runtime)
        trained resnet18 resnet18 --image-size 224 --batch-per-device 64 ;;
    memory)
        step 120 python3 "$REPO/benchmarks/bench_memory.py" --nproc 1 --batch-per-device 32 \
            --image-size 224 --models alexnet vgg16 resnet50 --strategies data
        step 90 python3 "$REPO/benchmarks/bench_recompute.py" --nproc 1 --image-size 224 \
            --batch 32 --cluster "$CLUSTER" ;;
    devicemodel)
        # AlexNet at 32 images per device took 23 s on an H200; VGG-16 and ResNet-50 at 32
        # took over 80 s, so they run smaller (54 s and 42 s there)
        step 60 python3 "$REPO/benchmarks/device_model_check.py" --cluster "$CLUSTER" \
            --models alexnet --devices 4 --out "$OUT/device-model-alexnet.json"
        step 100 python3 "$REPO/benchmarks/device_model_check.py" --cluster "$CLUSTER" \
            --models vgg16 --devices 4 --batch-per-device 8 --out "$OUT/device-model-vgg16.json"
        step 100 python3 "$REPO/benchmarks/device_model_check.py" --cluster "$CLUSTER" \
            --models resnet50 --devices 4 --batch-per-device 8 --image-size 112 \
            --out "$OUT/device-model-resnet50.json" ;;
    nd)
        # on 2 cores: 182, 98 and 376 tiles in 5, 3 and 28 s at 2 samples per device
        step 120 python3 "$REPO/benchmarks/device_model_check.py" --cluster "$CLUSTER" \
            --models m5,cosmoflow3d,unet3d --devices 4 --batch-per-device 8 \
            --out "$OUT/device-model-nd.json"
        trained m5 m5 --input-shape 1,16000 --batch-per-device 64
        trained cosmoflow3d cosmoflow3d --input-shape 1,64,64,64 --batch-per-device 16
        trained unet3d unet3d --input-shape 1,64,64,64 --batch-per-device 8 ;;
    dense)
        step 90 python3 -m layerwise profile unet3d_seg --input-shape 1,64,64,64 \
            --batch-per-device 8 --devices 1 --device cuda --out "$OUT/profile-unet3d_seg.json"
        for priced in "--analytic" "--profile $OUT/profile-unet3d_seg.json"; do
            # shellcheck disable=SC2086  # the option and its value, split on purpose
            step 90 python3 -m layerwise train unet3d_seg --input-shape 1,64,64,64 \
                --batch-per-device 8 --dataset segments --strategy data --nproc 1 \
                --steps 40 --cluster "$CLUSTER" $priced --out "$WORK/unet3d_seg${priced%% *}"
        done
        cp "$WORK/unet3d_seg--profile/result.json" "$OUT/train-unet3d_seg.json" 2>/dev/null ;;
    dispatch)
        step 60 python3 "$REPO/benchmarks/host_dispatch.py" --device cuda --out "$OUT/host.json"
        step 100 python3 "$REPO/benchmarks/tile_overlap.py" --device cuda --models resnet18 \
            --image-size 224 --batch 64
        step 200 python3 "$REPO/benchmarks/tile_overlap.py" --device cuda --models \
            "$(printf 'torchvision.models:%s;' mobilenet_v3_small efficientnet_b0 convnext_tiny \
            regnet_y_400mf)unet3d_seg" --image-size 64 --classes 10 --batch 32
        step 60 python3 -m layerwise train tiny_cnn --image-size 32 --batch-per-device 2 \
            --strategy data --nproc 1 --steps 40 --cluster "$CLUSTER" --analytic \
            --out "$WORK/tiny_cnn-2"
        cp "$WORK/tiny_cnn-2/result.json" "$OUT/train-tiny_cnn-2.json" 2>/dev/null ;;
    library)
        python3 -c "import torchvision; print('torchvision', torchvision.__version__)" || continue
        for builder in ${BUILDERS:-mobilenet_v3_small efficientnet_b0 convnext_tiny \
                shufflenet_v2_x1_0 regnet_y_400mf}; do
            step 60 python3 -m layerwise profile "torchvision.models:$builder" --image-size 64 \
                --classes 10 --batch-per-device 32 --devices 1 --device cuda \
                --out "$WORK/profile-$builder.json"
            step 60 python3 -m layerwise train "torchvision.models:$builder" --image-size 64 \
                --classes 10 --batch-per-device 32 --strategy data --nproc 1 --steps 10 \
                --cluster "$CLUSTER" --profile "$WORK/profile-$builder.json" \
                --out "$WORK/$builder-profiled"
        done ;;
    *) echo "unknown part '$part': runtime, memory, devicemodel, nd, dense, dispatch or" \
            "library"; exit 2 ;;
    esac
done
