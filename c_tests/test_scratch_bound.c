/* Scratch memory is bounded whatever the count: a large fcclAllReduceWire (float32
 * over bfloat16) may raise this rank's peak resident memory (VmHWM) by little more
 * than the library's fixed-size scratch, not in proportion to the message. The
 * user's buffers are touched before the peak is read, so only the library's own
 * memory can move it. Process mode, one rank per process (threads would add up). */
#include "harness.h"

#define COUNT ((size_t)32 << 20)      /* 128 MiB of float32 per buffer, 64 MiB on the wire */
#define BOUND ((size_t)80 << 20)      /* the library's windows need ~48 MiB */

static size_t peak_bytes(void) {
  char line[256];
  size_t kib = 0;
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %zu kB", &kib) == 1) break;
  fclose(f);
  return kib * 1024;
}

static int body(fcclComm_t comm, int rank, int nranks) {
  float* send;
  float* recv;
  size_t i, before, after;
  if (fccl_threads_mode()) return FCCL_SKIP;
  send = (float*)fccl_xmalloc(COUNT * sizeof(float));
  recv = (float*)fccl_xmalloc(COUNT * sizeof(float));
  for (i = 0; i < COUNT; i++) {
    send[i] = (float)((i + (size_t)rank) % 8);
    recv[i] = -1.0f;
  }
  /* a small call first, so the library's fixed structures are in place */
  CHECK_OK(fcclAllReduceWire(send, recv, 1024, fcclFloat32, fcclSum, fcclBfloat16, comm, NULL));
  before = peak_bytes();
  fccl_phase("fcclAllReduceWire of %zu elements", COUNT);
  if (CHECK_OK(fcclAllReduceWire(send, recv, COUNT, fcclFloat32, fcclSum, fcclBfloat16, comm, NULL))) {
    for (i = 0; i < COUNT; i += 4099) {
      size_t want = 0;
      int r;
      for (r = 0; r < nranks; r++) want += (i + (size_t)r) % 8;
      if (recv[i] != (float)want) {
        CHECK(0, "element %zu is %g, expected %zu", i, (double)recv[i], want);
        break;
      }
    }
  }
  after = peak_bytes();
  CHECK(before > 0 && after > 0, "VmHWM not readable");
  CHECK(after - before <= BOUND,
        "the peak resident memory grew by %zu MiB during one all_reduce of %zu MiB over a bfloat16 wire; the "
        "library's scratch should stay near its fixed windows (<= %zu MiB), not grow with the count",
        (after - before) >> 20, (COUNT * sizeof(float)) >> 20, BOUND >> 20);
  printf("rank %d: peak resident memory grew by %zu MiB\n", rank, (after - before) >> 20);
  free(send);
  free(recv);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
