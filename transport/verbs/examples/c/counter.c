/*
 * counter.c - a counter shared over FETCH_ADD by two processes, through
 * the C API. The parent (rnic1) holds an 8-byte counter in a region with
 * remote-atomic access and one QP per client; two forked children (rnic0)
 * each FETCH_ADD 1 to it ADDS times, checking that the values they get
 * back strictly increase. The parent then checks the counter is 2 x ADDS.
 *
 *   dataplane --config configs/loopback.toml --serve &
 *   cc -Itransport/verbs/include transport/verbs/examples/c/counter.c \
 *      -Ltarget/release -lverbs -Wl,-rpath,$PWD/target/release -o counter
 *   ./counter /tmp/rnic/loopback.sock
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rnic_verbs.h"

#define ADDS 500
#define CLIENTS 2

static const char *me = "counter";

static void die(const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", me, what, rnic_last_error());
	exit(1);
}

static void swap_endpoints(int wr, int rd, const struct rnic_endpoint *mine, struct rnic_endpoint *peer)
{
	if (write(wr, mine, sizeof *mine) != sizeof *mine || read(rd, peer, sizeof *peer) != sizeof *peer) {
		fprintf(stderr, "%s: endpoint exchange failed\n", me);
		exit(1);
	}
}

static int client(const char *socket, int wr, int rd)
{
	struct rnic_endpoint mine, peer;
	struct rnic_context *ctx;
	struct rnic_pd *pd;
	struct rnic_mr *mr;
	struct rnic_cq *cq;
	struct rnic_qp *qp;
	uint64_t last = 0;
	int i;
	me = "counter client";
	if (!(ctx = rnic_open_device(socket, "rnic0", 0)) || !(pd = rnic_alloc_pd(ctx)) ||
	    !(mr = rnic_reg_mr(pd, 8, RNIC_ACCESS_LOCAL_WRITE)) || !(cq = rnic_create_cq(ctx, 16)) ||
	    !(qp = rnic_create_qp(pd, cq, 16)) || rnic_qp_endpoint(qp, NULL, &mine))
		die("setup");
	swap_endpoints(wr, rd, &mine, &peer);
	if (rnic_connect_qp(qp, &peer))
		die("connect_qp");
	for (i = 0; i < ADDS; i++) {
		struct rnic_send_wr w = {
			.wr_id = (uint64_t)i,
			.opcode = RNIC_WR_ATOMIC_FETCH_AND_ADD,
			.signaled = 1,
			.lkey = rnic_mr_lkey(mr),
			.length = 8,
			.local_addr = rnic_mr_va(mr),
			.remote_addr = peer.va,
			.rkey = peer.rkey,
			.compare_add = 1,
		};
		struct rnic_wc wc;
		int n;
		if (rnic_post_send(qp, &w, 1))
			die("post FETCH_ADD");
		while ((n = rnic_poll_cq(cq, 1, &wc)) == 0)
			if (rnic_wait_cq(cq, 10000) == 0) {
				fprintf(stderr, "%s: FETCH_ADD %d: no completion\n", me, i);
				return 1;
			}
		if (n < 0 || wc.status != RNIC_WC_SUCCESS || wc.opcode != RNIC_WC_FETCH_ADD) {
			fprintf(stderr, "%s: FETCH_ADD %d: %s\n", me, i, rnic_wc_status_str(wc.status));
			return 1;
		}
		uint64_t v;
		memcpy(&v, rnic_mr_addr(mr), 8);
		if (i > 0 && v <= last) {
			fprintf(stderr, "%s: FETCH_ADD %d returned %llu after %llu\n", me, i,
				(unsigned long long)v, (unsigned long long)last);
			return 1;
		}
		last = v;
	}
	char done = 'd';
	if (write(wr, &done, 1) != 1)
		return 1;
	printf("client %d: %d FETCH_ADDs, last returned %llu\n", (int)getpid() % 100000, ADDS,
	       (unsigned long long)last);
	return 0;
}

int main(int argc, char **argv)
{
	const char *socket = argc > 1 ? argv[1] : "/tmp/rnic/loopback.sock";
	struct rnic_context *ctx;
	struct rnic_pd *pd;
	struct rnic_mr *mr;
	struct rnic_cq *cq;
	struct rnic_qp *qp[CLIENTS];
	int to_child[CLIENTS][2], to_parent[CLIENTS][2];
	pid_t pid[CLIENTS];
	int c, status, failed = 0;

	if (!(ctx = rnic_open_device(socket, "rnic1", 0)) || !(pd = rnic_alloc_pd(ctx)) ||
	    !(mr = rnic_reg_mr(pd, 8, RNIC_ACCESS_LOCAL_WRITE | RNIC_ACCESS_REMOTE_ATOMIC)) ||
	    !(cq = rnic_create_cq(ctx, 16)))
		die("setup");
	memset(rnic_mr_addr(mr), 0, 8);
	fflush(stdout);
	for (c = 0; c < CLIENTS; c++) {
		struct rnic_endpoint mine, peer;
		if (pipe(to_child[c]) || pipe(to_parent[c]))
			return 1;
		if ((pid[c] = fork()) < 0)
			return 1;
		if (pid[c] == 0) {
			int rc = client(socket, to_parent[c][1], to_child[c][0]);
			fflush(stdout);
			_exit(rc);
		}
		if (!(qp[c] = rnic_create_qp(pd, cq, 16)) || rnic_qp_endpoint(qp[c], mr, &mine))
			die("create_qp");
		swap_endpoints(to_child[c][1], to_parent[c][0], &mine, &peer);
		if (rnic_connect_qp(qp[c], &peer))
			die("connect_qp");
	}
	for (c = 0; c < CLIENTS; c++) {
		char done;
		if (read(to_parent[c][0], &done, 1) != 1)
			failed = 1;
		if (waitpid(pid[c], &status, 0) != pid[c] || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed = 1;
	}
	uint64_t v;
	memcpy(&v, rnic_mr_addr(mr), 8);
	if (failed || v != (uint64_t)CLIENTS * ADDS) {
		fprintf(stderr, "counter: the counter holds %llu after %d x %d adds%s\n",
			(unsigned long long)v, CLIENTS, ADDS, failed ? " (a client failed)" : "");
		return 1;
	}
	printf("ok: counter = %llu after %d FETCH_ADDs from %d processes\n", (unsigned long long)v,
	       CLIENTS * ADDS, CLIENTS);
	return 0;
}
