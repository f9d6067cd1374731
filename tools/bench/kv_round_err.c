// SPDX-License-Identifier: MIT
/*
 * How far each KV rounding of KVMEM_CPU_KV_ROUND (kernels/kernels_fp8.h)
 * moves the agentlang model's raw K and V: one 1x `bench recall`
 * workspace (2032 tokens, seed 1010000000, the needles at depths 0.1, 0.5,
 * 0.9, 8 look-alikes) prefilled on the cpu backend in chunks of 128; per
 * layer, K and V apart, the relative rms error (sqrt(sum (r - x)^2 / sum
 * x^2)) of bf16, fp8 (a scale a row), fp8-g16 and int8; the share of
 * values below e4m3's normal range at the row's scale (the only ones a
 * finer power-of-two scale rounds differently); a row's largest magnitude
 * over its rms, mean over rows; for K, fp8-kc's error (a block of 32
 * tokens' mean per head kept in fp32, the rest e4m3) and the share of K's
 * energy (sum x^2) its block means carry: what centring can take from the
 * mantissa's error; the same for one mean a head over the workspace (or
 * over another workspace: CAL_SEED). Documentation/recall.md, "Where fp8 KV
 * loses recall". Then, per layer, what the roundings do to attention
 * (attention_err).
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. -Iinclude -Iuser tools/bench/kv_round_err.c \
 *      build/libkvmem_agentlang.a build/libkvmem.a -lopenblas -luring -lnuma -lxxhash \
 *      -lpcre2-8 -lunistring -ljansson -lm -lpthread -fopenmp -o /tmp/kv_round_err
 *   /tmp/kv_round_err [MODEL_DIR [CAL_SEED]]  (default models/agentlang; CAL_SEED:
 *       the one mean a head from that seed's workspace, not the measured one's)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentlang/agentlang.h"
#include "backend/backend_impl.h"
#include "engine/engine.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/session.h"
#include "kernels/kernels.h"

#define MAX_LAYERS 64
#define MAX_DIM 256
#define CHUNK 128

static const int modes[] = { KVMEM_KV_ROUND_BF16, KVMEM_KV_ROUND_FP8, KVMEM_KV_ROUND_FP8_G16,
			     KVMEM_KV_ROUND_INT8 };
#define N_MODES 4

/* Sums over the rows of one layer, K or V. */
struct sums {
	double err[N_MODES], signal, below_normal, values, crest, rows;
	double err_kc;		/* K: fp8-kc, a block's mean kept (kvmem_kv_round_k_run) */
	double offset;		/* K: sum over rows of |their block's mean|^2 */
	double err_kg, offset_g;	/* the same for the workspace's one mean per head */
};

/* K of one layer over the whole workspace ([T][H][D]): the error of e4m3
 * a row around one mean per head (the workspace's: an oracle for a mean
 * calibrated ahead), and the share of energy that mean carries. A mean
 * shared by every key shifts a query's scores by one constant, which
 * softmax ignores: such a format would need no mean in its pages. */
static void head_mean(double *m, const float *x, int64_t T, int H, int D, int h)
{
	for (int i = 0; i < D; i++)
		m[i] = 0;
	for (int64_t t = 0; t < T; t++)
		for (int i = 0; i < D; i++)
			m[i] += x[((size_t)t * H + h) * D + i];
	for (int i = 0; i < D; i++)
		m[i] /= (double)T;
}

/* cal (NULL: x itself): K of the same layer from another workspace, whose
 * mean is used instead (a mean calibrated ahead, not the oracle). */
static void add_global(struct sums *s, const float *x, int64_t T, const float *cal,
		       int64_t cal_T, int H, int D)
{
	float y[MAX_DIM];

	for (int h = 0; h < H; h++) {
		double m[MAX_DIM];

		head_mean(m, cal ? cal : x, cal ? cal_T : T, H, D, h);
		for (int i = 0; i < D; i++)
			s->offset_g += m[i] * m[i] * (double)T;
		for (int64_t t = 0; t < T; t++) {
			const float *row = x + ((size_t)t * H + h) * D;

			for (int i = 0; i < D; i++)
				y[i] = row[i] - (float)m[i];
			kvmem_fp8_roundtrip_rows(y, 1, D);
			for (int i = 0; i < D; i++) {
				const double e = (double)((float)m[i] + y[i]) - row[i];

				s->err_kg += e * e;
			}
		}
	}
}

static void add_row(struct sums *s, const float *x, int d, int is_v)
{
	const float below = 0x1p-6f * kvmem_fp8_row_scale(x, d);	/* e4m3's least normal */
	double amax = 0, ss = 0;
	float y[MAX_DIM];

	for (int i = 0; i < d; i++) {
		ss += (double)x[i] * x[i];
		amax = fmax(amax, fabs(x[i]));
		s->below_normal += fabsf(x[i]) < below;
	}
	s->signal += ss;
	s->values += d;
	s->crest += amax / sqrt(ss / d);
	s->rows++;
	for (int m = 0; m < N_MODES; m++) {
		memcpy(y, x, sizeof(float) * d);
		kvmem_kv_round_rows(y, 1, d, modes[m], is_v);
		for (int i = 0; i < d; i++)
			s->err[m] += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
	}
}

/* K of one layer, a chunk's rows [n][H][D] at slots t0..: fp8-kc's error
 * (blocks of KVMEM_BLOCK_DEFAULT, a part block as fp8 a row) and the share
 * of the rows' energy their block's mean carries. */
static void add_centred(struct sums *s, const float *x, int n, int H, int D, int64_t t0,
			float *y)
{
	const int B = KVMEM_BLOCK_DEFAULT;

	memcpy(y, x, sizeof(float) * n * H * D);
	kvmem_kv_round_k_run(y, n, H, D, t0, B, KVMEM_KV_ROUND_FP8_KC);
	for (size_t i = 0; i < (size_t)n * H * D; i++)
		s->err_kc += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
	for (int b0 = 0; b0 < n; b0 += B)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < D; i++) {
				const int len = n - b0 < B ? n - b0 : B;
				double m = 0;

				for (int t = b0; t < b0 + len; t++)
					m += x[((size_t)t * H + h) * D + i];
				m /= len;
				s->offset += m * m * len;
			}
}

/*
 * What the roundings do to attention, layer l: queries at every 16th
 * token from 64 on, each of its heads over keys 0..t (K rotated, as the
 * view holds it), exact against K rounded as fp8, fp8-kc and int8: the
 * mean KL divergence of the rounded attention from the exact one, and the
 * rms error of the scores over their spread (rms over keys of score - its
 * mean), means over queries and heads.
 */
#define N_ATT 3
static const int att_modes[N_ATT] = { KVMEM_KV_ROUND_FP8, KVMEM_KV_ROUND_FP8_KC,
				      KVMEM_KV_ROUND_INT8 };

static void attention_err(const kvmem_config *c, const float *q_raw, const float *k_raw,
			  int64_t T, double *kl, double *serr)
{
	const int H = c->n_kv_heads, NH = c->n_heads, D = c->head_dim;
	const size_t kw = (size_t)H * D;
	float *k[N_ATT + 1], *q = malloc(sizeof(float) * T * NH * D);
	int32_t *pos = malloc(sizeof(int32_t) * T);
	double *s0 = malloc(sizeof(double) * T), *s1 = malloc(sizeof(double) * T), nq = 0;

	for (int64_t t = 0; t < T; t++)
		pos[t] = (int32_t)t;
	memcpy(q, q_raw, sizeof(float) * T * NH * D);
	kvmem_rope(q, pos, (int)T, NH, D, c->rope_theta);
	for (int m = 0; m <= N_ATT; m++) {
		k[m] = malloc(sizeof(float) * T * kw);
		memcpy(k[m], k_raw, sizeof(float) * T * kw);
		if (m)	/* rounded as the engine would in chunks of CHUNK */
			for (int64_t t0 = 0; t0 < T; t0 += CHUNK)
				kvmem_kv_round_k_run(k[m] + t0 * kw, T - t0 < CHUNK ? (int)(T - t0) : CHUNK,
						     H, D, t0, KVMEM_BLOCK_DEFAULT, att_modes[m - 1]);
		kvmem_rope(k[m], pos, (int)T, H, D, c->rope_theta);
	}
	for (int m = 0; m < N_ATT; m++)
		kl[m] = serr[m] = 0;
	for (int64_t t = 64; t < T; t += 16)
		for (int hq = 0; hq < NH; hq++, nq++) {
			const float *qv = q + ((size_t)t * NH + hq) * D;
			const int h = hq / (NH / H);

			for (int m = 0; m <= N_ATT; m++) {
				double *sc = m ? s1 : s0, mx = -1e300, z = 0, mean = 0, var = 0, e2 = 0,
				       d = 0;

				for (int64_t u = 0; u <= t; u++) {
					const float *kv = k[m] + ((size_t)u * H + h) * D;
					double dot = 0;

					for (int i = 0; i < D; i++)
						dot += (double)qv[i] * kv[i];
					sc[u] = dot / sqrt((double)D);
					mx = fmax(mx, sc[u]);
				}
				if (!m)
					continue;
				/* KL(p0 || p1) from the two logit vectors */
				double mx0 = -1e300, z0 = 0;

				for (int64_t u = 0; u <= t; u++)
					mx0 = fmax(mx0, s0[u]);
				for (int64_t u = 0; u <= t; u++) {
					z0 += exp(s0[u] - mx0);
					z += exp(s1[u] - mx);
					mean += s0[u];
				}
				mean /= (double)(t + 1);
				for (int64_t u = 0; u <= t; u++) {
					const double p0 = exp(s0[u] - mx0) / z0;

					d += p0 * ((s0[u] - mx0 - log(z0)) - (s1[u] - mx - log(z)));
					var += (s0[u] - mean) * (s0[u] - mean);
					e2 += (s1[u] - s0[u]) * (s1[u] - s0[u]);
				}
				kl[m - 1] += d;
				serr[m - 1] += sqrt(e2 / var);
			}
		}
	for (int m = 0; m < N_ATT; m++) {
		kl[m] /= nq;
		serr[m] /= nq;
	}
	for (int m = 0; m <= N_ATT; m++)
		free(k[m]);
	free(q);
	free(pos);
	free(s0);
	free(s1);
}

static int fail(const char *what)
{
	fprintf(stderr, "kv_round_err: %s: %s\n", what, kvmem_last_error());
	return 1;
}

static void ws_params(agentlang_params *p, uint64_t seed)
{
	static const double depths[3] = { 0.1, 0.5, 0.9 };

	agentlang_params_default(p);
	p->seed = seed;
	p->n_tokens = 2032;
	p->n_questions = 3;
	p->depths = depths;
	p->lookalikes = 8;
}

/* The raw K [L][T][H][D] of workspace `seed` prefilled on a fresh cpu
 * backend (NULL on failure, with a message). */
static float *workspace_k(kvmem_model *m, uint64_t seed, int64_t *T)
{
	const kvmem_config *c = &m->cfg;
	const size_t kw = (size_t)c->n_kv_heads * c->head_dim;
	agentlang_params p;
	agentlang_transcript ws;
	kvmem_backend *b;
	kvmem_view *v;
	float *all = NULL, *rk = NULL, *logits = NULL;

	ws_params(&p, seed);
	if (agentlang_transcript_build(&p, &ws) < 0)
		return NULL;
	if (kvmem_backend_open("cpu", m, &(kvmem_backend_opts){ .max_chunk = CHUNK }, &b) < 0)
		goto out_ws;
	all = malloc(sizeof(float) * c->n_layers * ws.n_ids * kw);
	rk = malloc(sizeof(float) * c->n_layers * CHUNK * kw);
	logits = malloc(sizeof(float) * c->vocab);
	if (!all || !rk || !logits || b->ops->view_create(b->ctx, &v) < 0)
		goto fail;
	if (b->ops->reserve(b->ctx, v, ws.n_ids) < 0)
		goto fail_view;
	for (int64_t t0 = 0; t0 < ws.n_ids; t0 += CHUNK) {
		const int n = ws.n_ids - t0 < CHUNK ? (int)(ws.n_ids - t0) : CHUNK;
		kvmem_fwd_out out = { .raw_k = rk };

		if (kvmem_backend_append_out(b, v, ws.ids + t0, n, logits, 0, &out) < 0)
			goto fail_view;
		for (int l = 0; l < c->n_layers; l++)
			memcpy(all + ((size_t)l * ws.n_ids + t0) * kw, rk + (size_t)l * n * kw,
			       sizeof(float) * n * kw);
	}
	*T = ws.n_ids;
	b->ops->view_destroy(b->ctx, v);
	goto done;
fail_view:
	b->ops->view_destroy(b->ctx, v);
fail:
	free(all);
	all = NULL;
done:
	free(rk);
	free(logits);
	kvmem_backend_close(b);
out_ws:
	agentlang_transcript_free(&ws);
	return all;
}

int main(int argc, char **argv)
{
	static struct sums sums[2][MAX_LAYERS];
	float *cal = NULL;
	int64_t cal_T = 0;
	kvmem_model *m;
	kvmem_backend *b;
	kvmem_view *v;
	agentlang_params p;
	agentlang_transcript ws;

	if (kvmem_model_load(argc > 1 ? argv[1] : "models/agentlang", &m) < 0)
		return fail("model");
	const kvmem_config *c = &m->cfg;
	const int L = c->n_layers, H = c->n_kv_heads, D = c->head_dim;

	if (L > MAX_LAYERS || D > MAX_DIM) {
		fprintf(stderr, "kv_round_err: %d layers of head_dim %d: at most %d, %d\n", L, D,
			MAX_LAYERS, MAX_DIM);
		return 1;
	}
	if (argc > 2 && !(cal = workspace_k(m, strtoull(argv[2], NULL, 10), &cal_T)))
		return fail("calibration workspace");
	ws_params(&p, 1010000000);
	if (agentlang_transcript_build(&p, &ws) < 0)
		return fail("workspace");
	if (kvmem_backend_open("cpu", m, &(kvmem_backend_opts){ .max_chunk = CHUNK }, &b) < 0 ||
	    b->ops->view_create(b->ctx, &v) < 0 || b->ops->reserve(b->ctx, v, ws.n_ids) < 0)
		return fail("cpu backend");

	float *rk = malloc(sizeof(float) * L * CHUNK * H * D), *rv = malloc(sizeof(float) * L * CHUNK * H * D);
	float *logits = malloc(sizeof(float) * c->vocab), *y = malloc(sizeof(float) * CHUNK * H * D);
	float *all_k = malloc(sizeof(float) * L * ws.n_ids * H * D);	/* [L][T][H][D] */
	const size_t qw = (size_t)c->n_heads * D;
	float *rq = malloc(sizeof(float) * L * CHUNK * qw), *all_q = malloc(sizeof(float) * L * ws.n_ids * qw);

	if (!rk || !rv || !logits || !y || !all_k || !rq || !all_q)
		return 1;
	for (int64_t t0 = 0; t0 < ws.n_ids; t0 += CHUNK) {
		const int n = ws.n_ids - t0 < CHUNK ? (int)(ws.n_ids - t0) : CHUNK;
		kvmem_fwd_out out = { .raw_k = rk, .v = rv, .q_raw = rq };

		if (kvmem_backend_append_out(b, v, ws.ids + t0, n, logits, 0, &out) < 0)
			return fail("prefill");
		for (int l = 0; l < L; l++)
			memcpy(all_q + ((size_t)l * ws.n_ids + t0) * qw, rq + (size_t)l * n * qw,
			       sizeof(float) * n * qw);
		for (int kv = 0; kv < 2; kv++)
			for (int l = 0; l < L; l++)
				for (int r = 0; r < n * H; r++)
					add_row(&sums[kv][l], (kv ? rv : rk) + ((size_t)l * n * H + r) * D, D, kv);
		for (int l = 0; l < L; l++) {
			add_centred(&sums[0][l], rk + (size_t)l * n * H * D, n, H, D, t0, y);
			memcpy(all_k + ((size_t)l * ws.n_ids + t0) * H * D, rk + (size_t)l * n * H * D,
			       sizeof(float) * n * H * D);
		}
	}
	for (int l = 0; l < L; l++)
		add_global(&sums[0][l], all_k + (size_t)l * ws.n_ids * H * D, ws.n_ids,
			   cal ? cal + (size_t)l * cal_T * H * D : NULL, cal_T, H, D);
	printf("tokens %lld, layers %d, kv heads %d, head_dim %d\n", (long long)ws.n_ids, L, H, D);
	printf("kv layer | rel rms err bf16 fp8 fp8-g16 int8 | subnormal share at row scale | "
	       "mean max/rms of a row | K: fp8-kc err, block mean's share of energy, "
	       "one mean a head: err, share\n");
	for (int kv = 0; kv < 2; kv++)
		for (int l = 0; l < L; l++) {
			const struct sums *s = &sums[kv][l];

			printf("%s %d |", kv ? "V" : "K", l);
			for (int i = 0; i < N_MODES; i++)
				printf(" %.4f", sqrt(s->err[i] / s->signal));
			printf(" | %.4f | %.2f", s->below_normal / s->values, s->crest / s->rows);
			if (!kv)
				printf(" | %.4f %.4f | %.4f %.4f", sqrt(s->err_kc / s->signal),
				       s->offset / s->signal, sqrt(s->err_kg / s->signal),
				       s->offset_g / s->signal);
			printf("\n");
		}
	printf("layer | attention KL(exact || rounded K), nats: fp8 fp8-kc int8 | score rms error "
	       "/ score spread: fp8 fp8-kc int8\n");
	for (int l = 0; l < L; l++) {
		double kl[N_ATT], se[N_ATT];

		attention_err(c, all_q + (size_t)l * ws.n_ids * qw, all_k + (size_t)l * ws.n_ids * H * D,
			      ws.n_ids, kl, se);
		printf("A %d | %.2e %.2e %.2e | %.4f %.4f %.4f\n", l, kl[0], kl[1], kl[2], se[0], se[1],
		       se[2]);
	}
	b->ops->view_destroy(b->ctx, v);
	kvmem_backend_close(b);
	agentlang_transcript_free(&ws);
	kvmem_model_free(m);
	free(rq);
	free(all_q);
	free(rk);
	free(rv);
	free(logits);
	free(y);
	free(all_k);
	free(cal);
	return 0;
}
