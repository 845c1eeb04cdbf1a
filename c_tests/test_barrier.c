/* fcclBarrier: 100 barriers interleaved with all_reduce, and an ordering check: before
 * barrier k every rank publishes "k" in a slot shared by all ranks (process memory in
 * threads mode, a mmap-ed file under the launcher); after it every slot must be >= k.
 * One rank is late at some iterations, so a barrier that lets ranks through early shows. */
#include "harness.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAXSLOTS 256
#define ITERS 100

static volatile int g_thread_slots[MAXSLOTS];

static void sleep_ms(int ms) {
  struct timespec ts;
  ts.tv_sec = 0;
  ts.tv_nsec = (long)ms * 1000000L;
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static void allreduce_check(fcclComm_t comm, int rank, int nranks, int it) {
  int32_t send[7], recv[7];
  int i;
  for (i = 0; i < 7; i++) send[i] = rank * 100 + i + it;
  memset(recv, 0xA5, sizeof recv);
  if (CHECK_OK(fcclAllReduce(send, recv, 7, fcclInt32, fcclSum, comm, NULL))) {
    for (i = 0; i < 7; i++) {
      int32_t want = (int32_t)(100 * nranks * (nranks - 1) / 2 + nranks * (i + it));
      CHECK(recv[i] == want, "iteration %d: allreduce element %d = %d, expected %d", it, i,
            (int)recv[i], (int)want);
    }
  }
}

static int body(fcclComm_t comm, int rank, int nranks) {
  volatile int* slots = g_thread_slots;
  void* map = NULL;
  char path[128] = "";
  int it, r, fd = -1;

  if (nranks > MAXSLOTS) return FCCL_SKIP;
  if (fccl_process_launched()) {
    /* every rank of one launch has the launcher as parent */
    snprintf(path, sizeof path, "/tmp/fccl_test_barrier_%ld_%d", (long)getppid(), nranks);
    fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd >= 0 && ftruncate(fd, (off_t)(MAXSLOTS * sizeof(int))) == 0)
      map = mmap(NULL, MAXSLOTS * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) map = NULL;
    if (!map) {
      printf("rank %d: no shared file (%s): ordering check off\n", rank, path);
      slots = NULL;
    } else {
      slots = (volatile int*)map;
    }
    CHECK_OK(fcclBarrier(comm, NULL));
    if (slots && rank == 0) memset(map, 0, MAXSLOTS * sizeof(int));
    CHECK_OK(fcclBarrier(comm, NULL));
  } else if (fccl_threads_mode()) {
    fccl_sync(comm);
    g_thread_slots[rank] = 0;
    fccl_sync(comm);
  }

  for (it = 1; it <= ITERS; it++) {
    fccl_phase("barrier iteration %d", it);
    if (it % 10 == 3 && rank == (it / 10) % nranks) sleep_ms(20); /* a late rank */
    if (slots) slots[rank] = it;
    CHECK_OK(fcclBarrier(comm, NULL));
    if (slots) {
      for (r = 0; r < nranks; r++) {
        int v = slots[r];
        CHECK(v >= it && v <= it + 1,
              "after barrier %d rank %d's counter is %d: it had not reached the barrier yet", it,
              r, v);
      }
    }
    if (it % 10 == 0) allreduce_check(comm, rank, nranks, it);
  }

  CHECK_OK(fcclBarrier(comm, NULL));
  if (map) munmap(map, MAXSLOTS * sizeof(int));
  if (fd >= 0) close(fd);
  CHECK_OK(fcclBarrier(comm, NULL));
  if (path[0] && rank == 0) unlink(path);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
