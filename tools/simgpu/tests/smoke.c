/* Smoke test of the simulated driver as a C program sees it: loaded by name with dlopen,
 * the way CUDA applications and cudarc load the real libcuda.so.1 (run through
 * scripts/sim-gpu.sh, which puts target/simgpu on LD_LIBRARY_PATH).
 *
 * Also checks the SONAME: after loading the library as libnvrtc.so, dlopen of
 * "libcuda.so.1" with RTLD_NOLOAD must find the same, already loaded, library. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CHECK(call)                                                              \
    do {                                                                         \
        CUresult rc_ = (call);                                                   \
        if (rc_ != 0) {                                                          \
            fprintf(stderr, "smoke: %s failed: %d\n", #call, rc_);              \
            return 1;                                                            \
        }                                                                        \
    } while (0)

#define SYM(lib, name)                                                           \
    name##_t name = (name##_t)dlsym(lib, #name);                                 \
    if (!name) {                                                                 \
        fprintf(stderr, "smoke: no symbol %s: %s\n", #name, dlerror());          \
        return 1;                                                                \
    }

typedef CUresult (*cuInit_t)(unsigned);
typedef CUresult (*cuDeviceGetCount_t)(int *);
typedef CUresult (*cuDevicePrimaryCtxRetain_t)(CUcontext *, CUdevice);
typedef CUresult (*cuCtxSetCurrent_t)(CUcontext);
typedef CUresult (*cuMemAlloc_v2_t)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemcpyHtoD_v2_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*cuMemcpyDtoH_v2_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*cuCtxSynchronize_t)(void);
typedef CUresult (*cuMemFree_v2_t)(CUdeviceptr);
typedef int (*nvrtcVersion_t)(int *, int *);

int main(void) {
    void *nvrtc = dlopen("libnvrtc.so", RTLD_NOW | RTLD_LOCAL);
    if (!nvrtc) {
        fprintf(stderr, "smoke: dlopen libnvrtc.so: %s\n", dlerror());
        return 1;
    }
    SYM(nvrtc, nvrtcVersion);
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != 0 || major != 13) {
        fprintf(stderr, "smoke: nvrtcVersion %d.%d\n", major, minor);
        return 1;
    }
    void *already = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (already != nvrtc) {
        fprintf(stderr, "smoke: libcuda.so.1 is not the loaded library (SONAME): %p vs %p\n", already, nvrtc);
        return 1;
    }

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        fprintf(stderr, "smoke: dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    SYM(cuda, cuInit);
    SYM(cuda, cuDeviceGetCount);
    SYM(cuda, cuDevicePrimaryCtxRetain);
    SYM(cuda, cuCtxSetCurrent);
    SYM(cuda, cuMemAlloc_v2);
    SYM(cuda, cuMemcpyHtoD_v2);
    SYM(cuda, cuMemcpyDtoH_v2);
    SYM(cuda, cuCtxSynchronize);
    SYM(cuda, cuMemFree_v2);

    CHECK(cuInit(0));
    int n = 0;
    CHECK(cuDeviceGetCount(&n));
    if (n < 1) {
        fprintf(stderr, "smoke: %d devices\n", n);
        return 1;
    }
    CUcontext ctx = NULL;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc_v2(&d, 4096));
    char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (char)(i * 13);
    memset(out, 0, sizeof out);
    CHECK(cuMemcpyHtoD_v2(d, in, sizeof in));
    CHECK(cuMemcpyDtoH_v2(out, d, sizeof out));
    CHECK(cuCtxSynchronize());
    if (memcmp(in, out, sizeof in) != 0) {
        fprintf(stderr, "smoke: data differs after the round trip\n");
        return 1;
    }
    CHECK(cuMemFree_v2(d));
    if (cuMemFree_v2(d) != 1) {
        fprintf(stderr, "smoke: double free was not CUDA_ERROR_INVALID_VALUE\n");
        return 1;
    }
    printf("smoke ok: %d simulated devices\n", n);
    return 0;
}
