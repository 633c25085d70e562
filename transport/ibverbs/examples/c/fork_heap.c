/*
 * fork_heap.c - fork after registering a small malloc'd buffer, with the
 * parent and the child both busy in malloc at once. Registration moves the
 * buffer's heap page into memory shared with the daemon; a child of fork
 * must get a private copy of that page as it was at the fork, whatever
 * the parent writes there afterwards. 40 rounds; every child must finish
 * its own malloc work and exit 0.
 *
 *   cc transport/ibverbs/examples/c/fork_heap.c -libverbs -o fork_heap
 *   LD_LIBRARY_PATH=target/release/ibverbs ./fork_heap
 */
#define _GNU_SOURCE
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define ROUNDS 40
#define CHURN 20000

/* Allocates and frees small blocks of varied sizes (the heap page of the
 * registered buffer among them); returns a checksum so nothing is elided. */
static unsigned churn(unsigned seed)
{
	void *live[64] = { 0 };
	unsigned sum = 0;
	for (int i = 0; i < CHURN; i++) {
		seed = seed * 1103515245u + 12345u;
		int k = (seed >> 16) % 64;
		free(live[k]);
		size_t n = 8 + (seed >> 8) % 200;
		live[k] = malloc(n);
		if (!live[k])
			die("malloc", ENOMEM);
		memset(live[k], (int)i, n);
		sum += ((unsigned char *)live[k])[n - 1];
	}
	for (int k = 0; k < 64; k++)
		free(live[k]);
	return sum;
}

int main(void)
{
	me = "fork_heap";
	struct side s;
	open_side(&s, "rnic1", 4);
	/* Small: it shares its heap page with malloc's other blocks. */
	struct ibv_mr *mr = buffer(&s, 8, IBV_ACCESS_LOCAL_WRITE);
	unsigned sum = 0;
	for (int r = 0; r < ROUNDS; r++) {
		pid_t pid = fork();
		if (pid < 0)
			die("fork", errno);
		if (pid == 0)
			_exit(churn((unsigned)r) == 0xFFFFFFFFu ? 2 : 0);
		sum += churn((unsigned)r + 1000);
		int status;
		if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0) {
			fprintf(stderr, "%s: child of round %d failed (status %#x)\n",
				me, r, status);
			return 1;
		}
	}
	free_buffer(mr);
	close_side(&s);
	printf("ok: %d forks after registering heap memory, every child's heap intact (%u)\n",
	       ROUNDS, sum & 0xF);
	return 0;
}
