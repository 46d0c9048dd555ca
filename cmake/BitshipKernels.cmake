# bitship_add_kernels: being written
