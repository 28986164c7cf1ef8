# gpu-env.sh: sourced first by every command sent to the GPU host.  Unpacks
# the portable build (scripts/build-gpu.sh) into /tmp/mj, puts moejit on
# PATH and the CUDA libraries on the loader path, and prints what is there.
mkdir -p /tmp/mj && tar -xzf build-gpu/bin.tgz -C /tmp/mj || { echo "gpu-env: no build-gpu/bin.tgz"; exit 1; }
export PATH=/tmp/mj:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOEJIT_CACHE_DIR=/tmp/mj-cache # not under $OUT: the device tool brings back only so many files
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader 2>/dev/null
moejit version | sed -n '1p;5p'
