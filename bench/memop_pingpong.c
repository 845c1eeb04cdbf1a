/*
 * memop_pingpong: the floor under every small-message figure of ranks that share one
 * GPU. Two processes on device 0 bounce a counter through one page of host shared
 * memory with stream memory operations, as ferroccl's one-GPU data plane orders its
 * calls (docs/cuda.md): process A's stream writes ping = i and waits for pong >= i;
 * process B's stream waits for ping >= i and writes pong = i. All rounds are queued
 * up front, so the time per round is the GPU's own, not the host's.
 *
 * Three cases: memory operations only; A also copies 256 bytes device to device in
 * each round; both do. Without MPS the GPU time-slices between the two processes'
 * contexts when both have work, which the last case shows.
 *
 *   cc -O2 bench/memop_pingpong.c -o memop_pingpong -ldl   (no CUDA headers needed)
 *   ./memop_pingpong [--rounds N]
 *
 * Prints one line per case: "<case>: <us> us per round trip (<N> rounds)". Exit 0
 * when every case completed, 77 without a CUDA driver or device, 1 on an error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

#define CU_MEMHOSTREGISTER_PORTABLE 1
#define CU_MEMHOSTREGISTER_DEVICEMAP 2
#define CU_STREAM_WAIT_VALUE_GEQ 0
#define CU_STREAM_NON_BLOCKING 1

static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*MemHostRegister)(void *, size_t, unsigned);
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);
  CUresult (*StreamWriteValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);
} cu;

#define PAGE 4096
/* Words of the page, each on its own line: ping, pong, the case both sides are at, and
 * B's "set up". */
#define PING 0
#define PONG 64
#define GO 128
#define READY 192

static int load(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return -1;
#define SYM(field, name)                                  \
  if (!(*(void **)&cu.field = dlsym(h, name))) {          \
    fprintf(stderr, "memop_pingpong: the driver lacks %s\n", name); \
    return -2;                                            \
  }
  SYM(Init, "cuInit");
  SYM(DeviceGetCount, "cuDeviceGetCount");
  SYM(DeviceGet, "cuDeviceGet");
  SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(CtxSetCurrent, "cuCtxSetCurrent");
  SYM(StreamCreate, "cuStreamCreate");
  SYM(StreamSynchronize, "cuStreamSynchronize");
  SYM(MemHostRegister, "cuMemHostRegister_v2");
  SYM(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  SYM(MemAlloc, "cuMemAlloc_v2");
  SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  SYM(StreamWaitValue32, "cuStreamWaitValue32_v2");
  SYM(StreamWriteValue32, "cuStreamWriteValue32_v2");
#undef SYM
  return 0;
}

#define CHECK(call)                                                          \
  do {                                                                       \
    CUresult rc_ = (call);                                                   \
    if (rc_ != 0) {                                                          \
      fprintf(stderr, "memop_pingpong: %s failed: CUresult %d\n", #call, rc_); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile uint32_t *word(unsigned char *page, int off) { return (volatile uint32_t *)(page + off); }

/* One process's part of every case. A reports the times. */
static int side(int is_a, unsigned char *page, int rounds) {
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CUdeviceptr d, buf;
  CHECK(cu.Init(0));
  CHECK(cu.DeviceGet(&dev, 0));
  CHECK(cu.DevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cu.CtxSetCurrent(ctx));
  CHECK(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cu.MemHostRegister(page, PAGE, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  CHECK(cu.MemHostGetDevicePointer(&d, page, 0));
  CHECK(cu.MemAlloc(&buf, 512));
  /* A times nothing before B has set up too. */
  if (is_a) {
    while (__atomic_load_n(word(page, READY), __ATOMIC_ACQUIRE) == 0) usleep(100);
  } else {
    __atomic_store_n(word(page, READY), 1u, __ATOMIC_RELEASE);
  }
  static const char *names[] = {"memory operations only", "A also copies 256 B a round",
                                "both copy 256 B a round"};
  uint32_t base = 0;
  for (int c = 0; c < 3; c++) {
    int copies = is_a ? c >= 1 : c == 2;
    /* Both sides start a case together: A raises GO, B waits for it on the host. */
    if (is_a) {
      __atomic_store_n(word(page, GO), (uint32_t)(c + 1), __ATOMIC_RELEASE);
    } else {
      while (__atomic_load_n(word(page, GO), __ATOMIC_ACQUIRE) < (uint32_t)(c + 1)) usleep(100);
    }
    double t0 = now_s();
    for (int i = 1; i <= rounds; i++) {
      uint32_t k = base + (uint32_t)i;
      if (is_a) {
        if (copies) CHECK(cu.MemcpyDtoDAsync(buf, buf + 256, 256, s));
        CHECK(cu.StreamWriteValue32(s, d + PING, k, 0));
        CHECK(cu.StreamWaitValue32(s, d + PONG, k, CU_STREAM_WAIT_VALUE_GEQ));
      } else {
        CHECK(cu.StreamWaitValue32(s, d + PING, k, CU_STREAM_WAIT_VALUE_GEQ));
        if (copies) CHECK(cu.MemcpyDtoDAsync(buf, buf + 256, 256, s));
        CHECK(cu.StreamWriteValue32(s, d + PONG, k, 0));
      }
    }
    CHECK(cu.StreamSynchronize(s));
    double t1 = now_s();
    base += (uint32_t)rounds;
    if (is_a) {
      printf("%s: %.2f us per round trip (%d rounds)\n", names[c], (t1 - t0) * 1e6 / rounds, rounds);
      fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int rounds = 2000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: %s [--rounds N]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1) {
    fprintf(stderr, "memop_pingpong: --rounds must be at least 1\n");
    return 2;
  }
  int l = load();
  if (l == -1) {
    printf("skipped: no CUDA driver (libcuda.so.1)\n");
    return 77;
  }
  if (l) return 1;
  /* The page, shared before either process starts CUDA (CUDA does not survive fork). */
  char name[64];
  snprintf(name, sizeof name, "/fccl-pingpong-p%d", (int)getpid());
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, PAGE) != 0) {
    perror("memop_pingpong: shm_open");
    return 1;
  }
  unsigned char *page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  shm_unlink(name);
  if (page == MAP_FAILED) {
    perror("memop_pingpong: mmap");
    return 1;
  }
  memset(page, 0, PAGE);
  pid_t b = fork();
  if (b < 0) {
    perror("memop_pingpong: fork");
    return 1;
  }
  if (b == 0) _exit(side(0, page, rounds));
  int ndev = 0;
  int rc;
  if (cu.Init(0) != 0 || cu.DeviceGetCount(&ndev) != 0 || ndev == 0) {
    printf("skipped: no CUDA device\n");
    kill(b, SIGKILL);
    waitpid(b, NULL, 0);
    return 77;
  }
  rc = side(1, page, rounds);
  if (rc != 0) kill(b, SIGKILL);
  int st = 0;
  waitpid(b, &st, 0);
  if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    fprintf(stderr, "memop_pingpong: process B failed (status %d)\n", st);
    rc = 1;
  }
  return rc;
}
