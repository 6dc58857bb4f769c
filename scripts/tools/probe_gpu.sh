#!/usr/bin/env bash
# Measures a CUDA GPU's roofs (on the GPU machine; needs nvcc and PyTorch with CUDA) and prints
# them one per line; scripts/tools/gpu_profile.py turns that output into a sparsim hardware profile:
#
#   bash scripts/tools/probe_gpu.sh | tee docs/results/cuda/h200_probe.log
#   scripts/tools/gpu_profile.py docs/results/cuda/h200_probe.log --name h200-measured \
#       --out data/hardware/h200-measured.json
#
# launch: an empty kernel launched 20000 times back to back on one stream (async) and 2000 times
# with a synchronisation after each (sync), 5 runs; copy / read: a 1 GiB fp32 device copy (bytes
# read + written) and sum; fp32 / tf32 / bf16: 8192^3 matrix products through PyTorch (cuBLAS);
# gemv: fp32 16384 x 16384 matrix-vector product. CUDA events, medians of 9 after 3 warm-ups.
set -euo pipefail
cat > /tmp/l.cu <<'X'
#include <cstdio>
__global__ void e(){}
int main(){cudaStream_t s;cudaStreamCreate(&s);cudaEvent_t a,b;cudaEventCreate(&a);cudaEventCreate(&b);for(int i=0;i<2000;++i)e<<<1,32,0,s>>>();cudaStreamSynchronize(s);for(int r=0;r<5;++r){cudaEventRecord(a,s);for(int i=0;i<20000;++i)e<<<1,32,0,s>>>();cudaEventRecord(b,s);cudaEventSynchronize(b);float m;cudaEventElapsedTime(&m,a,b);cudaEventRecord(a,s);for(int i=0;i<2000;++i){e<<<1,32,0,s>>>();cudaStreamSynchronize(s);}cudaEventRecord(b,s);cudaEventSynchronize(b);float q;cudaEventElapsedTime(&q,a,b);printf("launch_async_us %.3f launch_sync_us %.3f\n",m*1e3/20000,q*1e3/2000);}}
X
nvcc -O2 -o /tmp/l /tmp/l.cu && /tmp/l
python3 - <<'X'
import torch,statistics as st
def T(f,r=9):
  for _ in range(3):f()
  torch.cuda.synchronize();o=[]
  for _ in range(r):
    a=torch.cuda.Event(enable_timing=True);b=torch.cuda.Event(enable_timing=True);a.record();f();b.record();b.synchronize();o.append(a.elapsed_time(b)*1e-3)
  return st.median(o)
p=torch.cuda.get_device_properties(0);print(p.name,p.total_memory,"L2",p.L2_cache_size,"SM",p.multi_processor_count,torch.__version__,torch.version.cuda)
n=1<<28;s=torch.ones(n,device="cuda");d=torch.empty_like(s)
print("copy_GBs",2*n*4/T(lambda:d.copy_(s))/1e9,"read_GBs",n*4/T(lambda:s.sum())/1e9)
del d,s;m=8192;A=torch.randn(m,m,device="cuda");B=torch.randn(m,m,device="cuda")
torch.backends.cuda.matmul.allow_tf32=False;print("fp32_TF",2*m**3/T(lambda:A@B)/1e12)
torch.backends.cuda.matmul.allow_tf32=True;print("tf32_TF",2*m**3/T(lambda:A@B)/1e12)
torch.backends.cuda.matmul.allow_tf32=False;Ab=A.bfloat16();Bb=B.bfloat16();print("bf16_TF",2*m**3/T(lambda:Ab@Bb)/1e12)
del A,B,Ab,Bb;r=16384;W=torch.randn(r,r,device="cuda");v=torch.randn(r,device="cuda");print("gemv_GBs",(r*r*4)/T(lambda:W@v)/1e9)
X
date -u +%FT%TZ
