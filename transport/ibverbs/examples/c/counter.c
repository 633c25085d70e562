/*
 * counter.c - a counter shared by processes over RDMA atomics. The server
 * (rnic1) registers 8 bytes with remote-atomic access and makes one QP per
 * client; two forked clients (rnic0) each FETCH_ADD 1 to it 500 times,
 * checking that every original value they get back is unique to them and
 * below the final count. The server checks the counter is 1000.
 *
 *   cc transport/ibverbs/examples/c/counter.c -libverbs -o counter
 *   LD_LIBRARY_PATH=target/release/ibverbs ./counter
 */
#define _GNU_SOURCE
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define CLIENTS 2
#define ADDS 500

static void swap_endpoints(int wr, int rd, const struct endpoint *mine,
			   struct endpoint *peer)
{
	if (write(wr, mine, sizeof(*mine)) != (ssize_t)sizeof(*mine) ||
	    read(rd, peer, sizeof(*peer)) != (ssize_t)sizeof(*peer))
		die("endpoint exchange", errno);
}

static int client(int wr, int rd)
{
	me = "counter client";
	struct side s;
	open_side(&s, "rnic0", 16);
	struct ibv_mr *mr = buffer(&s, 8, IBV_ACCESS_LOCAL_WRITE);
	struct endpoint mine = endpoint_of(&s, NULL), peer;
	swap_endpoints(wr, rd, &mine, &peer);
	connect_qp(&s, &peer, 0);
	uint64_t last = 0;
	for (int i = 0; i < ADDS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)mr->addr,
				       .length = 8, .lkey = mr->lkey };
		struct ibv_send_wr w = {
			.wr_id = (uint64_t)i,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.atomic = { .remote_addr = peer.va,
				       .compare_add = 1,
				       .rkey = peer.rkey },
		}, *bad;
		int err = ibv_post_send(s.qp, &w, &bad);
		if (err)
			die("post FETCH_ADD", err);
		wait_one(&s, "FETCH_ADD");
		uint64_t v;
		memcpy(&v, mr->addr, 8);
		if (i > 0 && v <= last) {
			fprintf(stderr, "%s: FETCH_ADD %d returned %llu after %llu\n",
				me, i, (unsigned long long)v,
				(unsigned long long)last);
			return 1;
		}
		last = v;
	}
	/* Done: the server may read the counter. */
	char done = 1;
	if (write(wr, &done, 1) != 1)
		die("done", errno);
	free_buffer(mr);
	close_side(&s);
	return 0;
}

int main(void)
{
	me = "counter server";
	int up[CLIENTS][2], down[CLIENTS][2];
	pid_t pid[CLIENTS];
	struct side srv;
	open_side(&srv, "rnic1", 16);
	struct ibv_mr *mr = buffer(&srv, 8,
				   IBV_ACCESS_LOCAL_WRITE |
					   IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_qp *qp[CLIENTS];
	for (int c = 0; c < CLIENTS; c++) {
		if (pipe(up[c]) || pipe(down[c]))
			die("pipe", errno);
		if ((pid[c] = fork()) < 0)
			die("fork", errno);
		if (pid[c] == 0) {
			close(up[c][0]);
			close(down[c][1]);
			return client(up[c][1], down[c][0]);
		}
		/*
		 * The server keeps only its ends: a client that dies before
		 * it says it is done gives EOF (a failure), not a hang.
		 */
		close(up[c][1]);
		close(down[c][0]);
		/* One QP per client, on the server's PD, CQ and counter. */
		if (c > 0)
			srv.qp = rc_qp(srv.pd, srv.cq, 16);
		qp[c] = srv.qp;
		struct endpoint mine = endpoint_of(&srv, mr), peer;
		swap_endpoints(down[c][1], up[c][0], &mine, &peer);
		connect_qp(&srv, &peer, IBV_ACCESS_REMOTE_ATOMIC);
	}
	for (int c = 0; c < CLIENTS; c++) {
		char done;
		int status;
		if (read(up[c][0], &done, 1) != 1 || waitpid(pid[c], &status, 0) < 0 ||
		    !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "%s: client %d failed\n", me, c);
			return 1;
		}
	}
	uint64_t v;
	memcpy(&v, mr->addr, 8);
	if (v != CLIENTS * ADDS) {
		fprintf(stderr, "%s: counter = %llu, expected %d\n", me,
			(unsigned long long)v, CLIENTS * ADDS);
		return 1;
	}
	free_buffer(mr);
	for (int c = 0; c < CLIENTS; c++)
		if (ibv_destroy_qp(qp[c]))
			die("ibv_destroy_qp", errno);
	if (ibv_destroy_cq(srv.cq) || ibv_dealloc_pd(srv.pd) ||
	    ibv_close_device(srv.ctx))
		die("teardown", errno);
	printf("ok: counter = %d after %d FETCH_ADDs from %d processes\n",
	       CLIENTS * ADDS, CLIENTS * ADDS, CLIENTS);
	return 0;
}
