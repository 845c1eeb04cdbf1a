// The simulated GPU's CUDA C prelude (ferroccl tools/simgpu, docs/sim-gpu.md): what a kernel
// source may use besides C++17 when the host's C++ compiler builds it. The simulator runs a
// launch one thread at a time: every block of the grid in order, every thread of a block in
// order, so threads cannot wait for each other (no __shared__ memory, no __syncthreads).
#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static_assert(false, "the simulated GPU (ferroccl simgpu) runs one thread at a time: __shared__ memory is not supported (docs/sim-gpu.md)");
#define __constant__ static_assert(false, "the simulated GPU (ferroccl simgpu) does not support __constant__ memory (docs/sim-gpu.md)");
#define __syncthreads() static_assert(false, "the simulated GPU (ferroccl simgpu) runs one thread at a time: __syncthreads is not supported (docs/sim-gpu.md)")

struct uint3 { unsigned int x, y, z; };
typedef uint3 dim3;
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static const int warpSize = 32;

static inline unsigned int __float_as_uint(float x) { unsigned int u; __builtin_memcpy(&u, &x, 4); return u; }
static inline int __float_as_int(float x) { int u; __builtin_memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
static inline float __int_as_float(int u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
static inline long long __double_as_longlong(double x) { long long u; __builtin_memcpy(&u, &x, 8); return u; }
static inline double __longlong_as_double(long long u) { double x; __builtin_memcpy(&x, &u, 8); return x; }
// IEEE maxNum/minNum (a NaN operand loses); the sign of a zero result may differ from a GPU's.
static inline float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
static inline float fminf(float a, float b) { return __builtin_fminf(a, b); }
static inline double fmax(double a, double b) { return __builtin_fmax(a, b); }
static inline double fmin(double a, double b) { return __builtin_fmin(a, b); }
static inline float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
static inline float fmin(float a, float b) { return __builtin_fminf(a, b); }
static inline float fabsf(float a) { return __builtin_fabsf(a); }
static inline double fabs(double a) { return __builtin_fabs(a); }
static inline float fabs(float a) { return __builtin_fabsf(a); }
template <typename T> static inline T __ldg(const T* p) { return *p; }
extern "C" int printf(const char*, ...);
