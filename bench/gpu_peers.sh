#!/usr/bin/env bash
# onnxruntime-gpu and the model builder on the GPU machine, in parts that fit one device call
# each beside this repository (its tracked files take ~36 MB of disk blocks of the 64 MiB a call carries).
#
# Here:   bench/gpu_peers.sh stage        # .device/peers/ortxz.partNN (27 MB each, 8 parts)
#         (needs ../shared/gpu/stage_peers.sh run first: it downloads the wheels)
# There:  bench/gpu_peers.sh part         # one call per part, carrying .device/peers/ortxz.partNN,
#                                         # calls less than 30 s apart so the machine stays warm
#         bench/gpu_peers.sh install      # after the last part (carry .device/peers/builder and
#                                         # ortxz.sha256 too): onnxruntime-gpu under /tmp/ortgpu,
#                                         # /tmp/ort_env.sh, the builder under /tmp/ob
# Ray Serve (bench/serve.py on the GPU) the same way, in two parts:
# Here:   bench/gpu_peers.sh stage-ray    # .device/peers/rayxz.partNN: ray[serve] and its
#                                         # dependencies for Python 3.12, unpacked, without
#                                         # Ray's Java jars, as one tar.xz (57 MB)
# There:  bench/gpu_peers.sh part         # (copies whichever parts are carried)
#         bench/gpu_peers.sh install-ray  # after the last part: Ray under /tmp/ray_site
# The wheel is repacked as tar.xz without the TensorRT provider (unused): 204 MB instead of 256.
set -euo pipefail
P=.device/peers
case "${1:-}" in
  stage)
    whl=$(realpath "$(ls "$P"/dl/onnxruntime_gpu-*.whl)")
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    (cd "$work" && unzip -q "$whl" && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so \
      && tar cf - onnxruntime onnxruntime_gpu-*.dist-info | xz -T2 -6 >ort.tar.xz)
    rm -f "$P"/ortxz.part*
    split -b 27000000 -d "$work/ort.tar.xz" "$P/ortxz.part"
    (cd "$work" && sha256sum ort.tar.xz) >"$P/ortxz.sha256"
    ls -la "$P"/ortxz.*
    ;;
  stage-ray)
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    pip download -q "ray[serve]" -c constraints.txt --python-version 3.12 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 --only-binary=:all: -d "$work/dl"
    # numpy and the like are on the GPU machine already
    for w in "$work"/dl/*.whl; do
      case "$(basename "$w")" in numpy-*|py_spy-*|virtualenv-*|jinja2-*|markupsafe-*) continue ;; esac
      unzip -q -o "$w" -d "$work/site"
    done
    rm -rf "$work/site/ray/jars"
    tar cf - -C "$work/site" . | xz -T2 -6 >"$work/ray.tar.xz"
    rm -f "$P"/rayxz.part*
    split -b 27000000 -d "$work/ray.tar.xz" "$P/rayxz.part"
    (cd "$work" && sha256sum ray.tar.xz) >"$P/rayxz.sha256"
    ls -la "$P"/rayxz.*
    ;;
  part)
    mkdir -p /tmp/x && for f in "$P"/ortxz.part* "$P"/rayxz.part*; do [ -f "$f" ] && cp "$f" /tmp/x/; done; ls /tmp/x
    ;;
  install-ray)
    cat /tmp/x/rayxz.part* >/tmp/x/ray.tar.xz
    (cd /tmp/x && sha256sum -c "$OLDPWD/$P/rayxz.sha256")
    mkdir -p /tmp/ray_site && tar xJf /tmp/x/ray.tar.xz -C /tmp/ray_site
    PYTHONPATH=/tmp/ray_site python3 -c "import ray, ray.serve; print('ray', ray.__version__)"
    ;;
  install)
    cat /tmp/x/ortxz.part* >/tmp/x/ort.tar.xz
    (cd /tmp/x && sha256sum -c "$OLDPWD/$P/ortxz.sha256")
    mkdir -p /tmp/ortgpu && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('/tmp/x/ort.tar.xz')).extractall('/tmp/ortgpu')"
    SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
    LIBS=$(find "$SP/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
    echo "export LD_LIBRARY_PATH=${LIBS}/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}" >/tmp/ort_env.sh
    . /tmp/ort_env.sh
    PYTHONPATH=/tmp/ortgpu python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
    if [ -d "$P/builder" ] && [ ! -d /tmp/ob/onnx_ir ]; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/ob "$P"/builder/onnx_ir-*.whl
      cp -r "$P/builder/onnxruntime_genai" /tmp/ob/
      echo "model builder installed under /tmp/ob"
    fi
    ;;
  *)
    echo "usage: bench/gpu_peers.sh stage | stage-ray | part | install | install-ray"; exit 2 ;;
esac
