"""Adder kernels, one module per backend, all with forward(...) and grad_input(...):
cpu (compiled C, built by build.py), eager (chunked PyTorch), triton (CUDA)."""
