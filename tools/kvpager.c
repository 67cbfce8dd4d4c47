/*
 * kvpager - the main job: long-context decoding whose KV cache does not fit
 * the RAM budget.
 *
 *   kvpager run [--preset P] [--context N] [--batch B]
 *               [--predictor exact|window|lowrank] [--steps N]
 *               [--budget BYTES] [--path DIR] [--json] ...
 *
 * Prefills a synthetic KV (lib/synth/kv_synth.h: sink tokens, a recent window,
 * heavy hitters, topic clusters; no model runs) for `batch` sequences of
 * `context` tokens through a pager region backed by a temporary file,
 * then decodes `steps` tokens per sequence with the chosen predictor,
 * prefetching layer-ahead, and reports tokens/s, the overlap of compute
 * and loads, bytes read, faults, prefetch outcomes, the reuse rate, and
 * (sampled against exact attention) recall and relative error.
 *
 * With --model, a real network (lib/model/model.h: a llama2.c checkpoint,
 * or seeded random weights at a preset's shape) is the KV source instead:
 * its prompt is prefilled, then it generates tokens, its attention reading
 * K and V through the pager; the tokens are printed.
 *
 * Settings come from the tunables' defaults, then the KVP_<TUNABLE>
 * variables, then the options (an option wins over its variable).  With
 * KVP_FUSE_MOUNT the KV tunables marked runtime change on the running
 * decode through the view (a tunable file, `apply`, `kvpctl set`): the
 * view's thread only checks and posts the new config; the decode loop
 * takes it up between two steps.  SIGINT and SIGTERM stop the run at the
 * next step (or sequence of the prefill) and clean up the view and the
 * registry entry; a second one ends the process at once.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lib/cache/cache_store.h"
#include "lib/cli/cli.h"
#include "lib/kv/device_pool.h"
#include "lib/cli/plot.h"
#include "lib/cli/progress.h"
#include "lib/cli/timeline.h"
#include "lib/instance/instance.h"
#include "lib/kv/kvcache.h"
#include "lib/metrics/metrics_http.h"
#include "lib/model/model.h"
#include "lib/model/model_cache.h"
#include "lib/synth/kv_synth.h"
#include "lib/tunables/tunables.h"

/*
 * The options.  A numeric option is parsed by the tunables registry's
 * parser (kvp_tunable_parse), with the registry entry of its tunable when
 * it sets one (its range and its KVP_ variable) or with its own type and
 * range, so that every value is whole, in range, and refused with the
 * option's name.
 */
enum opt_id {
	O_PRESET,
	O_CONTEXT,
	O_BATCH,
	O_PRED,
	O_STEPS,
	O_WARMUP,
	O_BUDGET,
	O_RAM,
	O_PATH,
	O_DEPTH,
	O_NOPF,
	O_BLOCK,
	O_M,
	O_G,
	O_RANK,
	O_SEVERY,
	O_SLAYERS,
	O_THREADS,
	O_SEED,
	O_INSTALL,
	O_MODEL,
	O_PROMPT,
	O_GENERATE,
	O_TEMP,
	O_TOKENIZER,
	O_LOGITS,
	O_CACHE_DIR,
	O_CACHE_SALT,
	O_CACHE_MODEL_ID,
	O_CACHE_KEY_FILE,
	O_CACHE_CAPACITY,
	O_REMOTE,
	O_METRICS,
	O_DEVICE,
	O_DEVPOOL,
	O_PLOT,
	O_JSON,
	O_QUIET,
	O_HELP,
	O_COUNT
};

struct opt_spec {
	const char *name;    /* without the dashes */
	const char *arg;     /* NULL: a flag */
	const char *tunable; /* the registry entry it sets, or NULL */
	enum kvp_tunable_type type; /* otherwise: type and range */
	uint64_t min, max;
	const char *help;
};

static const struct opt_spec opts[O_COUNT] = {
	[O_PRESET] = { "preset", "P", NULL, 0, 0, 0, NULL },
	[O_CONTEXT] = { "context", "N", NULL, KVP_T_BYTES, 1, 1ULL << 31,
			"tokens per sequence, 32K allowed (32768)" },
	[O_BATCH] = { "batch", "B", NULL, KVP_T_UINT, 1, 65536,
		      "sequences (1)" },
	[O_PRED] = { "predictor", "K", "predictor", 0, 0, 0,
		     "exact | window | lowrank (exact)" },
	[O_STEPS] = { "steps", "N", NULL, KVP_T_UINT, 1, UINT32_MAX,
		      "decode steps (16)" },
	[O_WARMUP] = { "warmup", "N", NULL, KVP_T_UINT, 0, UINT32_MAX,
		       "steps left out of the figures (2)" },
	[O_BUDGET] = { "budget", "BYTES", "ram_budget_bytes", 0, 0, 0,
		       "RAM budget (a quarter of the KV, at least 2M)" },
	[O_RAM] = { "ram", "BYTES", NULL, KVP_T_BYTES, 2u << 20, 1ULL << 50,
		    "from the decode on, all the cache's RAM counted (frames, "
		    "predictor metadata, rolling, staging): the frames get "
		    "what the rest leaves" },
	[O_PATH] = { "path", "DIR", NULL, 0, 0, 0,
		     "where the backing file goes ($TMPDIR or /tmp)" },
	[O_DEPTH] = { "depth", "D", "prefetch_depth_layers", 0, 0, 0,
		      "prefetch depth in layers, 0: none (2; window and "
		      "lowrank: 8)" },
	[O_NOPF] = { "no-prefetch", NULL, NULL, 0, 0, 0,
		     "demand faults only (--depth 0)" },
	[O_BLOCK] = { "block", "BYTES", NULL, KVP_T_BYTES, 4096, 1ULL << 30,
		      "pager block (exact: 2M, or a layer's KV where less; "
		      "sparse: one KV block)" },
	[O_M] = { "budget-tokens", "M", "predict_budget_tokens", 0, 0, 0,
		  "sparse predictors' tokens per layer (400)" },
	[O_G] = { "block-tokens", "G", "kv_block_tokens", 0, 0, 0,
		  "tokens per KV block (4)" },
	[O_RANK] = { "rank", "R", "lowrank_rank", 0, 0, 0,
		     "lowrank's projection rank, at most KV heads x head dim "
		     "(128)" },
	[O_SEVERY] = { "sample-every", "N", NULL, KVP_T_UINT, 0, UINT32_MAX,
		       "score the choice against exact attention every N "
		       "steps, 0: never (4)" },
	[O_SLAYERS] = { "sample-layers", "K", NULL, KVP_T_UINT, 0, UINT32_MAX,
			"layers scored per sampled step (4)" },
	[O_THREADS] = { "threads", "T", "attention_threads", 0, 0, 0,
			"attention threads (0: all CPUs)" },
	[O_SEED] = { "seed", "S", NULL, KVP_T_UINT, 0, UINT64_MAX,
		     "synthetic KV seed (1)" },
	[O_INSTALL] = { "install", "MODE", "install_mode", 0, 0, 0,
			"auto | move | copy (auto)" },
	[O_MODEL] = { "model", "M", NULL, 0, 0, 0,
		      "a llama2.c checkpoint, or random:PRESET (seeded "
		      "weights at the preset's shape): the model makes the "
		      "KV" },
	[O_PROMPT] = { "prompt-tokens", "L", NULL, 0, 0, 0,
		       "model: prompt token ids, 1,2,3 or @FILE (else a "
		       "random prompt of --context tokens from --seed)" },
	[O_GENERATE] = { "generate", "N", NULL, KVP_T_UINT, 1, UINT32_MAX,
			 "model: tokens to generate (--steps)" },
	[O_TEMP] = { "temperature", "T", NULL, 0, 0, 0,
		     "model: sample at T with --seed (0: greedy, the "
		     "default)" },
	[O_TOKENIZER] = { "tokenizer", "FILE", NULL, 0, 0, 0,
			  "model: a llama2.c tokenizer.bin, to print text" },
	[O_LOGITS] = { "logits-out", "FILE", NULL, 0, 0, 0,
		       "model: write each generated token's logits "
		       "(float32)" },
	[O_CACHE_DIR] = { "cache-dir", "DIR", NULL, 0, 0, 0,
			  "model: prefix cache directory; a prompt's stored "
			  "prefix is read, not computed (KVP_CACHE_DIR)" },
	[O_CACHE_SALT] = { "cache-salt", "S", NULL, 0, 0, 0,
			   "model: the cache's namespace (KVP_CACHE_SALT)" },
	[O_CACHE_MODEL_ID] = { "cache-model-id", "NAME", NULL, 0, 0, 0,
			       "model: the cache's name for the model, instead "
			       "of its weights' hash (KVP_CACHE_MODEL_ID)" },
	[O_CACHE_KEY_FILE] = { "cache-key-file", "FILE", NULL, 0, 0, 0,
			       "model: encrypt the cache at rest with this "
			       "key (KVP_CACHE_KEY_FILE, KVP_CACHE_KEY)" },
	[O_CACHE_CAPACITY] = { "cache-capacity", "BYTES", NULL, KVP_T_BYTES,
			       1ULL << 20, 1ULL << 60,
			       "model: the cache's size limit "
			       "(KVP_CACHE_CAPACITY; none)" },
	[O_REMOTE] = { "remote", "URL", NULL, 0, 0, 0,
		       "model: a shared tier below --cache-dir: "
		       "redis://host:port[/db] or redis+cluster://host:port,... "
		       "(KVP_REMOTE_URL)" },
	[O_METRICS] = { "metrics-listen", "ADDR", NULL, 0, 0, 0,
			"serve /metrics over HTTP at ADDR: PORT (on "
			"127.0.0.1),\nHOST:PORT or [IPV6]:PORT; 0: a free "
			"port ($KVP_METRICS_LISTEN)" },
	[O_DEVICE] = { "device", "NAME", NULL, 0, 0, 0,
		       "where attention runs: cpu (default), cuda (a GPU, "
		       "fed from the pager through a device block pool), "
		       "emu (the cuda path emulated on the CPU: a check, "
		       "no speed)" },
	[O_DEVPOOL] = { "device-pool", "BYTES", NULL, KVP_T_BYTES, 4096,
			UINT64_MAX,
			"the device block pool (default: two layers' chosen "
			"blocks)" },
	[O_PLOT] = { "plot", "FILE", NULL, 0, 0, 0,
		     "draw the decode's per-step timeline (T_compute, T_load, "
		     "T_step, demand faults) into FILE, an .svg or a .png "
		     "(gnuplot)" },
	[O_JSON] = { "json", NULL, NULL, 0, 0, 0, "one JSON object on stdout" },
	[O_QUIET] = { "quiet", NULL, NULL, 0, 0, 0, "no progress on stderr" },
	[O_HELP] = { "help", NULL, NULL, 0, 0, 0, "this text" },
};

/* A tunable set by an option, applied over the KVP_ variables. */
struct opt_value {
	const struct kvp_tunable *t;
	uint64_t v;
	enum opt_id id;
};

struct run_opts {
	const char *preset;
	uint64_t context;
	uint32_t batch;
	uint32_t steps;
	uint32_t warmup;
	bool warmup_given;
	const char *path;
	bool json;
	bool quiet;
	uint64_t block; /* pager block bytes; 0: by predictor */
	uint64_t ram;	/* --ram: all the cache's RAM from the decode on */
	uint32_t sample_every;
	uint32_t sample_layers;
	uint64_t seed;
	struct opt_value set[O_COUNT]; /* tunables given as options */
	unsigned nset;
	const char *model;	/* checkpoint or random:PRESET; NULL: synthetic */
	const char *prompt;	/* --prompt-tokens: ids, or @FILE */
	const char *tokenizer;	/* llama2.c tokenizer.bin, or NULL */
	const char *logits_out; /* float32 logits of each generated token */
	const char *metrics_listen; /* --metrics-listen; NULL: the variable */
	double temperature;	/* 0: greedy */
	struct kvp_model_cache_opts cache; /* --cache-*; dir NULL: none */
	const char *device;	/* --device: NULL is the CPU */
	const char *plot;	/* --plot FILE, or NULL */
	uint64_t device_pool;	/* --device-pool bytes; 0: default */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- interruption --------------------------------------------------- */

/*
 * SIGINT and SIGTERM are blocked in every thread (the mask is set before
 * the first thread starts and inherited) and taken by one thread with
 * sigwait, so that no pager, view or attention thread sees EINTR and the
 * run stops only where it can clean up.  The second signal ends the
 * process as the signal would.  A signal ignored on entry stays ignored.
 */
static atomic_int stop_signal;

static void *signal_main(void *arg)
{
	sigset_t *set = arg;
	int sig;

	if (sigwait(set, &sig))
		return NULL;
	atomic_store(&stop_signal, sig);
	if (sigwait(set, &sig))
		return NULL;
	signal(sig, SIG_DFL);
	pthread_sigmask(SIG_UNBLOCK, set, NULL);
	raise(sig);
	return NULL;
}

static int signals_take(void)
{
	static const int sigs[] = { SIGINT, SIGTERM };
	static sigset_t set;
	pthread_t t;
	int i, err;

	sigemptyset(&set);
	for (i = 0; i < 2; i++) {
		struct sigaction sa;

		/* one ignored on entry (nohup, a background job) stays so */
		if (!sigaction(sigs[i], NULL, &sa) && sa.sa_handler != SIG_IGN)
			sigaddset(&set, sigs[i]);
	}
	err = pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (!err)
		err = pthread_create(&t, NULL, signal_main, &set);
	if (!err)
		pthread_detach(t);
	return -err;
}

static bool stopped(void)
{
	return atomic_load(&stop_signal) != 0;
}

/* ---- progress on stderr (lib/cli/progress.h) ------------------------- */

static void prefill_progress(void *arg, uint64_t done, uint64_t total)
{
	kvp_progress_update(arg, done >> 20, total >> 20, "MiB");
}

/* a model's prefill: the prompt's tokens */
static void model_prefill_progress(void *arg, uint64_t done, uint64_t total)
{
	kvp_progress_update(arg, done, total, "tokens");
}

/* ---- options ---------------------------------------------------------- */

/*
 * The options as the shared table (lib/cli/cli.h) that --help, the man
 * page and the completion read: one entry per opts[] entry, in order.
 */
static const struct kvp_cli_opt *cli_table(void)
{
	static struct kvp_cli_opt t[O_COUNT + 1];
	static char preset_help[256];
	const char *const *p = kvp_kv_geometry_presets();
	int i, n;

	if (t[0].name)
		return t;
	n = snprintf(preset_help, sizeof(preset_help), "model shape:");
	for (; *p && n < (int)sizeof(preset_help); p++)
		n += snprintf(preset_help + n, sizeof(preset_help) - n, " %s",
			      *p);
	if (n < (int)sizeof(preset_help))
		snprintf(preset_help + n, sizeof(preset_help) - n,
			 " (llama3-8b)");
	for (i = 0; i < O_COUNT; i++)
		t[i] = (struct kvp_cli_opt){ opts[i].name, 256 + i, 0,
					     opts[i].arg, opts[i].help };
	t[O_PRESET].help = preset_help;
	return t;
}

static const struct kvp_cli_cmd commands[] = {
	{ "run", "prefill, then decode through the pager, and report" },
	{ NULL, NULL },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvpager run [options]\n");
	kvp_cli_usage(f, cli_table());
	fprintf(f,
		"Every KV and engine tunable is also read from its KVP_<NAME> "
		"variable\n(kvpctl list shows them); an option wins over its "
		"variable.  A KVP_ name\nthat nothing reads is named with the "
		"nearest one that is.\n"
		"Without --model the KV is synthetic; no model runs, and the "
		"model: options\nare refused.\n");
}

/*
 * @a as option @id wants it: parsed by the registry's parser into *v,
 * range checked; on error a message naming the option.
 */
static int parse_value(enum opt_id id, const char *a, uint64_t *v)
{
	char name[40], err[KVP_TUNABLE_ERR_MAX];
	struct kvp_tunable t = { .type = opts[id].type,
				 .min = opts[id].min,
				 .max = opts[id].max };

	if (opts[id].tunable)
		t = *kvp_tunable_find(opts[id].tunable);
	snprintf(name, sizeof(name), "--%s", opts[id].name);
	t.name = name;
	if (kvp_tunable_parse(&t, a, v, err, sizeof(err))) {
		fprintf(stderr, "kvpager: %s\n", err);
		return -EINVAL;
	}
	return 0;
}


/* The option that set tunable @t, or NULL. */
static const struct opt_value *option_of(const struct run_opts *o,
					 const struct kvp_tunable *t)
{
	unsigned i;

	for (i = 0; i < o->nset; i++)
		if (o->set[i].t == t)
			return &o->set[i];
	return NULL;
}

/* Record tunable-setting option @id = @v; a later one wins. */
static void set_tunable(struct run_opts *o, enum opt_id id, uint64_t v)
{
	const struct kvp_tunable *t = kvp_tunable_find(opts[id].tunable);
	struct opt_value *s = (struct opt_value *)option_of(o, t);

	if (!s)
		s = &o->set[o->nset++];
	s->t = t;
	s->v = v;
	s->id = id;
}

/* An option of a model run only: its help says "model: ". */
static bool model_only(enum opt_id id)
{
	return opts[id].help && !strncmp(opts[id].help, "model: ", 7);
}

static int parse_args(int argc, char **argv, struct run_opts *o)
{
	struct option lo[O_COUNT + 1];
	char shorts[3 * O_COUNT + 1];
	int c, for_model = -1; /* the first model-only option given */
	uint64_t v;

	kvp_cli_getopt(cli_table(), "", lo, shorts);
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		enum opt_id id = (enum opt_id)(c - 256);
		const char *a = optarg;

		if (c == '?' || c < 256) {
			usage(stderr);
			return -EINVAL;
		}
		if (for_model < 0 && model_only(id))
			for_model = id;
		switch (id) {
		case O_PRESET:
			o->preset = a;
			continue;
		case O_PATH:
			o->path = a;
			continue;
		case O_JSON:
			o->json = true;
			continue;
		case O_QUIET:
			o->quiet = true;
			continue;
		case O_MODEL:
			o->model = a;
			continue;
		case O_PROMPT:
			o->prompt = a;
			continue;
		case O_TOKENIZER:
			o->tokenizer = a;
			continue;
		case O_LOGITS:
			o->logits_out = a;
			continue;
		case O_CACHE_DIR:
			o->cache.dir = a;
			continue;
		case O_CACHE_SALT:
			o->cache.salt = a;
			continue;
		case O_CACHE_MODEL_ID:
			o->cache.model_id = a;
			continue;
		case O_REMOTE:
			o->cache.remote_url = a;
			continue;
		case O_CACHE_KEY_FILE:
			o->cache.key_file = a;
			continue;
		case O_METRICS:
			o->metrics_listen = a;
			continue;
		case O_DEVICE:
			o->device = a;
			continue;
		case O_PLOT:
			o->plot = a;
			continue;
		case O_TEMP: {
			char *end;

			o->temperature = strtod(a, &end);
			if (end == a || *end || !(o->temperature >= 0) ||
			    o->temperature > 100) {
				fprintf(stderr,
					"kvpager: --temperature: '%s' is not a "
					"number from 0 (greedy) to 100\n",
					a);
				return -EINVAL;
			}
			continue;
		}
		case O_NOPF:
			set_tunable(o, O_DEPTH, 0);
			continue;
		case O_HELP:
			usage(stdout);
			exit(0);
		default:
			break;
		}
		if (parse_value(id, a, &v))
			return -EINVAL;
		if (opts[id].tunable) {
			set_tunable(o, id, v);
			continue;
		}
		switch (id) {
		case O_CONTEXT:
			o->context = v;
			break;
		case O_BATCH:
			o->batch = (uint32_t)v;
			break;
		case O_STEPS:
		case O_GENERATE:
			o->steps = (uint32_t)v;
			break;
		case O_WARMUP:
			o->warmup = (uint32_t)v;
			o->warmup_given = true;
			break;
		case O_BLOCK:
			o->block = v;
			break;
		case O_RAM:
			o->ram = v;
			break;
		case O_SEVERY:
			o->sample_every = (uint32_t)v;
			break;
		case O_SLAYERS:
			o->sample_layers = (uint32_t)v;
			break;
		case O_SEED:
			o->seed = v;
			break;
		case O_CACHE_CAPACITY:
			o->cache.capacity_bytes = v;
			break;
		case O_DEVPOOL:
			o->device_pool = v;
			break;
		default:
			break;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvpager: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	/* without a model the KV is synthetic: the option would do nothing */
	if (for_model >= 0 && !o->model) {
		fprintf(stderr,
			"kvpager: --%s is for a model run (without --model "
			"the KV is synthetic): add --model\n",
			opts[for_model].name);
		return -EINVAL;
	}
	if (o->warmup >= o->steps) {
		if (o->warmup_given) {
			fprintf(stderr,
				"kvpager: --warmup %u leaves no step to "
				"measure: use fewer than --steps %u\n",
				o->warmup, o->steps);
			return -EINVAL;
		}
		o->warmup = o->steps > 1 ? 1 : 0;
	}
	return 0;
}

/* Where tunable @name's value came from, for messages: the option, its
 * variable, or the option to set it ("--rank"). */
static const char *tunable_source(const struct run_opts *o, const char *name,
				  char *buf, size_t len)
{
	const struct kvp_tunable *t = kvp_tunable_find(name);
	const struct opt_value *v = option_of(o, t);
	int id;

	if (v) {
		snprintf(buf, len, "--%s", opts[v->id].name);
		return buf;
	}
	kvp_tunable_env_name(t, buf, len);
	if (getenv(buf))
		return buf;
	for (id = 0; id < O_COUNT; id++)
		if (opts[id].tunable && !strcmp(opts[id].tunable, name))
			break;
	snprintf(buf, len, "--%s", id < O_COUNT ? opts[id].name : name);
	return buf;
}

/* Whether tunable @name was given, by an option or its variable. */
static bool tunable_given(const struct run_opts *o, const char *name)
{
	const struct kvp_tunable *t = kvp_tunable_find(name);
	char env[96];

	kvp_tunable_env_name(t, env, sizeof(env));
	return option_of(o, t) || getenv(env);
}

/*
 * The engine and KV configs: the tunables' defaults (the budget: a
 * quarter of the KV), then the KVP_ variables, then the options.  On error
 * a message names the option or variable and what it accepts.
 */
static int configure(const struct run_opts *o, uint64_t kv_bytes,
		     struct kvp_config *cfg, struct kvp_kv_config *kv)
{
	struct kvp_tunable_target tg = { .pager = cfg, .kv = kv };
	const struct kvp_tunable *budget = kvp_tunable_find("ram_budget_bytes");
	char err[KVP_TUNABLE_ERR_MAX];
	size_t pos = 0;
	unsigned i;

	/* a misspelt variable would be ignored without a word */
	while (kvp_env_unknown_next(&pos, err, sizeof(err)))
		fprintf(stderr, "kvpager: warning: %s\n", err);
	kvp_config_defaults(cfg);
	kvp_kv_config_defaults(kv);
	cfg->ram_budget_bytes = kv_bytes / 4;
	if (cfg->ram_budget_bytes < budget->min)
		cfg->ram_budget_bytes = budget->min;
	if (cfg->ram_budget_bytes > budget->max)
		cfg->ram_budget_bytes = budget->max;
	if (kvp_tunables_load_env(&tg, err, sizeof(err))) {
		fprintf(stderr, "kvpager: %s\n", err);
		return -EINVAL;
	}
	for (i = 0; i < o->nset; i++) {
		if (kvp_tunable_set(&tg, o->set[i].t, o->set[i].v, err,
				    sizeof(err))) {
			fprintf(stderr, "kvpager: --%s: %s\n",
				opts[o->set[i].id].name, err);
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * The exact predictor's pager block: 2 MiB, or a layer's whole KV where
 * that is less (a small model or a short context: 3.75 KiB of KV in 2 MiB
 * blocks read 20 MiB a step, and layer-ahead prefetch wanted more than the
 * default budget).  @tokens: the cache's capacity.
 */
static size_t exact_pager_block(const struct kvp_kv_geometry *g,
				uint64_t tokens)
{
	uint64_t layer = (tokens + g->block_tokens - 1) / g->block_tokens *
			 kvp_kv_block_stride(g);

	return kvp_kv_pager_block_choose(g, layer < (2u << 20) ? layer
							       : 2u << 20);
}

/*
 * What the geometry allows of the KV config: the low-rank rank, the
 * sparse budget against the block, the prefetch depth against the layers
 * (the default depth is cut to the layers quietly, a depth asked for is
 * refused).  0, or -EINVAL with the message printed.
 */
static int check_geometry(const struct run_opts *o,
			  const struct kvp_kv_geometry *g,
			  struct kvp_kv_config *kv)
{
	uint32_t max_rank = kvp_predictor_max_rank(g);
	const char *shape = o->model ? "model" : "preset";
	char src[96], src2[96];

	/* The default rank is cut to a small shape's limit quietly, as the
	 * default depth is to its layers; a rank asked for is refused. */
	if (kv->predictor == KVP_PREDICTOR_LOWRANK &&
	    kv->lowrank_rank > max_rank &&
	    !tunable_given(o, "lowrank_rank"))
		kv->lowrank_rank = max_rank;
	if (kv->predictor == KVP_PREDICTOR_LOWRANK &&
	    kv->lowrank_rank > max_rank) {
		fprintf(stderr,
			"kvpager: lowrank: rank %" PRIu64 " is over this "
			"shape's limit of %u (%u KV heads x head dim %u of "
			"%s %s): set %s to 4..%u\n",
			kv->lowrank_rank, max_rank, g->kv_heads, g->head_dim,
			shape, o->preset,
			tunable_source(o, "lowrank_rank", src, sizeof(src)),
			max_rank);
		return -EINVAL;
	}
	if (kv->predictor != KVP_PREDICTOR_EXACT &&
	    kv->predict_budget_tokens < kv->kv_block_tokens) {
		fprintf(stderr,
			"kvpager: %s %" PRIu64 " is under one KV block of "
			"%" PRIu64 " tokens (%s): a sparse predictor could "
			"choose nothing\n",
			tunable_source(o, "predict_budget_tokens", src,
				       sizeof(src)),
			kv->predict_budget_tokens, kv->kv_block_tokens,
			tunable_source(o, "kv_block_tokens", src2,
				       sizeof(src2)));
		return -EINVAL;
	}
	if (kv->predictor != KVP_PREDICTOR_EXACT &&
	    !tunable_given(o, "prefetch_depth_layers"))
		kv->prefetch_depth_layers = KVP_KVCACHE_SPARSE_DEPTH;
	if (kv->prefetch_depth_layers > g->layers - 1) {
		if (tunable_given(o, "prefetch_depth_layers")) {
			fprintf(stderr,
				"kvpager: %s %" PRIu64 ": %s %s has %u "
				"layers, so prefetch reaches at most %u "
				"ahead\n",
				tunable_source(o, "prefetch_depth_layers", src,
					       sizeof(src)),
				kv->prefetch_depth_layers, shape, o->preset,
				g->layers, g->layers - 1);
			return -EINVAL;
		}
		kv->prefetch_depth_layers = g->layers - 1;
	}
	return 0;
}

/*
 * Warn when the budget cannot hold what layer-ahead prefetch keeps in
 * memory at once: the layer computing and the prefetch depth's layers
 * ahead, each as many pager blocks as the predictor chooses in a layer.
 * Below that, blocks are evicted before they are used and every step
 * reads (and faults) the layer again.
 */
static void warn_budget(const struct run_opts *o, const struct kvp_kv_config *kv,
			const struct kvp_kvcache *c, uint64_t budget)
{
	const struct kvp_kv_layout *l = kvp_kvcache_layout(c);
	uint64_t pbb = l->pager_block_bytes, G = kv->kv_block_tokens;
	uint64_t blocks = (o->context + G - 1) / G, per_layer, need;
	uint64_t layers = kv->prefetch_depth_layers + 1;
	char h1[32], h2[32], h3[32];

	if (kv->predictor == KVP_PREDICTOR_EXACT) {
		per_layer = (blocks * l->block_stride * o->batch + pbb - 1) /
			    pbb * pbb;
	} else {
		uint64_t chosen = kv->predict_budget_tokens / G + 1;

		if (chosen > blocks)
			chosen = blocks;
		per_layer = chosen * o->batch * pbb;
	}
	need = layers * per_layer;
	if (budget >= need)
		return;
	/* with the eviction watermark's headroom, rounded up to 1 MiB */
	need = need / 90 * 100;
	need = (need + (1u << 20) - 1) >> 20 << 20;
	kvp_format_bytes(need, h3, sizeof(h3));
	fprintf(stderr,
		"kvpager: warning: the RAM budget of %s is under the %" PRIu64
		" layer%s of KV that layer-ahead prefetch holds at once (%s "
		"per layer): blocks will be evicted before they are used and "
		"every step faults them in again; --budget %s or more would "
		"hold them%s\n",
		kvp_cli_human((double)budget, h1, sizeof(h1)), layers,
		layers > 1 ? "s" : "",
		kvp_cli_human((double)per_layer, h2, sizeof(h2)), h3,
		kv->prefetch_depth_layers > 1 ? ", or a lower --depth" : "");
}

/* ---- KV tunables changed through the view ------------------------------ */

/*
 * The view's thread posts a checked config here; the decode loop takes it
 * up between steps (kvp_kvcache_retune runs on the driving thread only).
 */
struct live_kv {
	pthread_mutex_t mu;	  /* guards want and pending */
	struct kvp_kvcache *c;	  /* read-only use: kvp_kvcache_retune_check */
	struct kvp_kv_config want; /* the latest config the view accepted */
	bool pending;		  /* want not yet taken up */
};

static int live_apply(void *arg, const struct kvp_kv_config *cfg,
		      const char **bad)
{
	struct live_kv *lv = arg;
	int r;

	pthread_mutex_lock(&lv->mu);
	r = kvp_kvcache_retune_check(lv->c, cfg, bad);
	if (!r) {
		lv->want = *cfg;
		lv->pending = true;
	}
	pthread_mutex_unlock(&lv->mu);
	/* The reason, for the view's last_error (kvpctl says it) too. */
	if (r == -EOPNOTSUPP) {
		*bad = "predictor lowrank: this run keeps no low-rank keys "
		       "(start it with --predictor lowrank to switch to and "
		       "from it)";
		fprintf(stderr, "kvpager: %s\n", *bad);
	} else if (r == -E2BIG) {
		*bad = !strcmp(*bad, "predictor")
			   ? "predictor exact: the device path holds the "
			     "blocks the predictor this run started with "
			     "chooses a layer, and exact chooses more (start "
			     "the run with --predictor exact)"
			   : "predict_budget_tokens: the device path holds "
			     "the blocks the budget this run started with "
			     "chooses a layer, and this one chooses more "
			     "(start the run with it, --budget-tokens)";
		fprintf(stderr, "kvpager: %s\n", *bad);
	}
	return r;
}

/*
 * Take up a posted config before decode step @step.  Returns true when the
 * config in use changed (*kv updated).  A change the cache refuses now
 * (out of memory) is reported and the view shown the config in use again.
 */
static bool live_take(struct live_kv *lv, struct kvp_fuse_view *view,
		      uint32_t step, struct kvp_kv_config *kv)
{
	struct kvp_kv_config want;
	const char *bad = NULL;
	bool pending;
	int r;

	pthread_mutex_lock(&lv->mu);
	pending = lv->pending;
	want = lv->want;
	lv->pending = false;
	pthread_mutex_unlock(&lv->mu);
	if (!pending || !memcmp(&want, kv, sizeof(want)))
		return false;
	r = kvp_kvcache_retune(lv->c, &want, &bad);
	if (r) {
		fprintf(stderr,
			"kvpager: step %u: cannot change %s now: %s; the run "
			"goes on as before\n",
			step, bad ? bad : "the kv config", kvp_strerror(r));
		kvp_view_set_kv(kvp_fuse_view_tree(view), kv, live_apply, lv);
		return false;
	}
	*kv = want;
	fprintf(stderr,
		"kvpager: from step %u: predictor %s, prefetch depth %" PRIu64
		", budget tokens %" PRIu64 ", sink tokens %" PRIu64 "\n",
		step, kvp_predictor_kind_name((enum kvp_predictor_kind)kv->predictor),
		kv->prefetch_depth_layers, kv->predict_budget_tokens,
		kv->sink_tokens);
	return true;
}

/* ---- the report -------------------------------------------------------- */

static void sub_stats(struct kvp_kvcache_step_stats *a,
		      const struct kvp_kvcache_step_stats *b)
{
	a->steps -= b->steps;
	a->tokens -= b->tokens;
	a->t_step_s -= b->t_step_s;
	a->t_compute_s -= b->t_compute_s;
	a->t_predict_s -= b->t_predict_s;
	a->t_wait_s -= b->t_wait_s;
	a->t_fill_s -= b->t_fill_s;
	a->bytes_read -= b->bytes_read;
	a->bytes_written -= b->bytes_written;
	a->demand_faults -= b->demand_faults;
	a->prefetch_issued -= b->prefetch_issued;
	a->prefetch_hit -= b->prefetch_hit;
	a->prefetch_late -= b->prefetch_late;
	a->prefetch_wasted -= b->prefetch_wasted;
	a->chosen_blocks -= b->chosen_blocks;
	a->reused_blocks -= b->reused_blocks;
	a->flush_store -= b->flush_store;
	a->flush_region -= b->flush_region;
}

/*
 * --plot: the step just done into @tl, from the cache's totals now less
 * @prev (then @prev = now), counted as the report counts the whole run: a
 * model's step is @wall_s in all, of which all but the cache's own step
 * is compute (its last layer, the logits, the sampling).
 */
static void timeline_step(struct kvp_timeline *tl, const struct kvp_kvcache *c,
			  struct kvp_kvcache_stats *prev, double wall_s,
			  bool model)
{
	struct kvp_kvcache_stats now;
	struct kvp_kvcache_step_stats d;

	kvp_kvcache_stats(c, &now);
	d = now.sum;
	sub_stats(&d, &prev->sum);
	kvp_timeline_add(
	    tl, &(struct kvp_timeline_step){
		    .t_step_s = model ? wall_s : d.t_step_s,
		    .t_compute_s = d.t_compute_s + d.t_predict_s + d.t_fill_s +
				   (model ? wall_s - d.t_step_s : 0),
		    .t_load_s = now.t_load_busy_s - prev->t_load_busy_s,
		    .demand_faults = d.demand_faults });
	*prev = now;
}

/* Prefetch outcomes over the measured steps, from the region's counters:
 * asked (blocks the plans named), loaded (the pager read them), and what
 * became of the loaded ones. */
struct pf_counts {
	uint64_t asked, loaded, hit, late, wasted;
};

static void pf_snapshot(const struct kvp_kvcache *c,
			const struct kvp_kvcache_stats *ks, struct pf_counts *p)
{
	struct kvp_region *r = kvp_kvcache_region(c);
	struct kvp_stats s;

	memset(&s, 0, sizeof(s));
	if (r)
		kvp_region_stats(r, &s);
	p->asked = ks->sum.prefetch_issued;
	/* a read into a reuse slot is for the layer about to compute */
	p->loaded = s.prefetch_issued_total + ks->slot_reads +
		    ks->slot_read_errors;
	p->hit = s.prefetch_hit_total + ks->slot_reads;
	p->late = s.prefetch_late_total + ks->slot_read_errors;
	p->wasted = s.prefetch_wasted_total;
}

static void pf_sub(struct pf_counts *a, const struct pf_counts *b)
{
	a->asked -= b->asked;
	a->loaded -= b->loaded;
	a->hit -= b->hit;
	a->late -= b->late;
	a->wasted -= b->wasted;
}

/* Loaded blocks whose fate falls outside the window: loaded before it and
 * used in it (negative), or loaded in it and not yet used at its end. */
static int64_t pf_open(const struct pf_counts *p)
{
	return (int64_t)p->loaded - (int64_t)(p->hit + p->late + p->wasted);
}

static void print_prefetch(const struct pf_counts *p)
{
	int64_t open = pf_open(p);

	printf("  prefetch              asked %" PRIu64 " blocks: %" PRIu64
	       " resident or loading already, %" PRIu64 " loaded\n",
	       p->asked, p->asked > p->loaded ? p->asked - p->loaded : 0,
	       p->loaded);
	/* Blocks loaded during the warm-up whose fate came after it are
	 * named with the loaded ones, so that the line adds up. */
	if (open < 0)
		printf("                        of those and %" PRId64
		       " loaded during the warm-up: ",
		       -open);
	else
		printf("                        of those loaded: ");
	printf("hit %" PRIu64 ", late %" PRIu64 ", wasted %" PRIu64, p->hit,
	       p->late, p->wasted);
	if (open > 0)
		printf(", %" PRId64 " not used yet when the run ended", open);
	printf("\n");
}

/* --ram: the frames become what the rest of the cache's RAM leaves
 * (kvp_kvcache_fit_ram, after the prefill grew the metadata, with what
 * the decode's steps will add to it); 0, or -errno said on stderr with
 * the parts. */
static int fit_ram(struct kvp_kvcache *c, uint64_t total, uint32_t steps)
{
	struct kvp_kvcache_ram ram;
	char h1[32], h2[32], h3[32], h4[32];
	int err = kvp_kvcache_fit_ram(c, total, steps);

	if (!err)
		return 0;
	kvp_kvcache_ram(c, &ram);
	/* as kvp_kvcache_fit_ram counts them: the metadata at the last
	 * step, the staging without the prefill's area (given back) */
	ram.metadata = kvp_kvcache_metadata_peak(c, steps);
	ram.staging = kvp_kvcache_layout(c)->pager_block_bytes;
	ram.total = ram.metadata + ram.rolling + ram.staging + (2u << 20);
	if (ram.total < ram.metadata)
		ram.total = UINT64_MAX; /* a peak past 64 bits */
	if (err == -ENOSPC)
		fprintf(stderr,
			"kvpager: --ram %s leaves no frames: predictor metadata "
			"%s by the last step, rolling buffers %s, staging %s; "
			"they and the 2.00 MiB of frames the pager needs take "
			"at least %" PRIu64 " bytes: give that --ram or more, "
			"or a smaller --rank (the low-rank metadata is rank / "
			"(KV heads x head dim) of the keys)\n",
			kvp_cli_human((double)total, h1, sizeof(h1)),
			kvp_cli_human((double)ram.metadata, h2, sizeof(h2)),
			kvp_cli_human((double)ram.rolling, h3, sizeof(h3)),
			kvp_cli_human((double)ram.staging, h4, sizeof(h4)),
			ram.total);
	else
		fprintf(stderr,
			"kvpager: cannot fit the cache in --ram %s: "
			"%s\n",
			kvp_cli_human((double)total, h1, sizeof(h1)),
			kvp_strerror(err));
	return err;
}

/* The view's seqs/<id>/block_table, served by the cache (kvcache.h). */
static const struct kvp_view_seq_ops kv_seq_ops = {
	kvp_kvcache_view_list,
	kvp_kvcache_view_block_table,
};

/* ---- the model as the KV source (--model) ---------------------------- */

struct model_run {
	struct kvp_model *m;	  /* NULL: the KV is synthetic */
	struct kvp_model_seq *seq; /* the one sequence's forward state */
	struct kvp_tokenizer *tok; /* --tokenizer, or NULL */
	uint32_t *prompt;	  /* prompt token ids */
	uint32_t nprompt;
	uint32_t *out;		  /* generated token ids */
	FILE *logits;		  /* --logits-out, or NULL */
	uint64_t rng;		  /* sampling state (--seed) */
	double t_model_s;	  /* measured steps: the model's own math */
	double t_wall_s;	  /* measured steps: whole kvp_model_step */
	struct kvp_model_cache *mc; /* --cache-dir, or NULL */
	struct kvp_store *kv_store; /* the KV cache's store with mc */
	double ttft_s;		  /* prefill start to the first token */
	double t_tok;		  /* when the last token's logits were out */
	double *gap_s;		  /* per step: since the token before */
	struct kvp_model_prefill_times pt; /* where the prefill's went */
};

static void model_run_free(struct model_run *mr)
{
	kvp_model_cache_close(mr->mc); /* waits for its writes */
	kvp_model_seq_destroy(mr->seq);
	kvp_model_close(mr->m);
	kvp_tokenizer_free(mr->tok);
	if (mr->logits)
		fclose(mr->logits);
	free(mr->prompt);
	free(mr->out);
	free(mr->gap_s);
}

/* Token ids separated by commas or white space, from arg or @FILE. */
static int prompt_parse(const char *arg, uint32_t vocab, struct model_run *mr)
{
	char *text = NULL, *p, *end;
	size_t cap = 0, len = 0;
	int err = -EINVAL;

	if (arg[0] == '@') {
		FILE *f = fopen(arg + 1, "r");

		if (!f || getdelim(&text, &cap, '\0', f) < 0) {
			fprintf(stderr,
				"kvpager: cannot read --prompt-tokens file "
				"'%s': %s\n",
				arg + 1, f ? "empty" : strerror(errno));
			if (f)
				fclose(f);
			free(text);
			return -EINVAL;
		}
		fclose(f);
	} else if (!(text = strdup(arg))) {
		return -ENOMEM;
	}
	mr->prompt = malloc(sizeof(uint32_t) * (strlen(text) / 2 + 1));
	if (!mr->prompt)
		goto out;
	for (p = text; *p;) {
		unsigned long v;

		if (strchr(", \t\r\n", *p)) {
			p++;
			continue;
		}
		errno = 0;
		v = strtoul(p, &end, 10);
		if (end == p || *p == '-' || errno || v >= vocab ||
		    (*end && !strchr(", \t\r\n", *end))) {
			fprintf(stderr,
				"kvpager: --prompt-tokens: '%.*s' is not a "
				"token id of the model (0 .. %u)\n",
				(int)strcspn(p, ", \t\r\n"), p, vocab - 1);
			goto out;
		}
		mr->prompt[len++] = (uint32_t)v;
		p = end;
	}
	if (!len) {
		fprintf(stderr, "kvpager: --prompt-tokens: no token ids\n");
		goto out;
	}
	mr->nprompt = (uint32_t)len;
	err = 0;
out:
	free(text);
	return err;
}

/*
 * Open --model and what goes with it; the geometry in *g (fp32 KV for a
 * checkpoint, the preset's element type for random weights) and the
 * prompt's length in o->context.  Messages on stderr.
 */
static int model_open(struct run_opts *o, struct model_run *mr,
		      struct kvp_kv_geometry *g)
{
	struct kvp_kv_geometry pg;
	enum kvp_kv_dtype dt = KVP_KV_FP32;
	const struct kvp_model_config *mc;
	char why[512];
	uint32_t i;
	int err;

	mr->rng = o->seed ? o->seed : 1;
	err = kvp_model_open(o->model, NULL, &mr->m, why, sizeof(why));
	if (err) {
		fprintf(stderr, "kvpager: %s\n", why);
		return err;
	}
	mc = kvp_model_config(mr->m);
	if (!strncmp(o->model, "random:", 7) &&
	    !kvp_kv_geometry_preset(o->model + 7, &pg))
		dt = pg.dtype;
	/* G comes from the KV config later */
	if (kvp_model_geometry(mr->m, dt, 4, g)) {
		fprintf(stderr, "kvpager: model '%s' has no KV geometry "
				"kvpager can page\n", o->model);
		return -EINVAL;
	}
	if (o->batch != 1) {
		fprintf(stderr, "kvpager: --model runs one sequence: drop "
				"--batch\n");
		return -EINVAL;
	}
	if (o->prompt) {
		err = prompt_parse(o->prompt, mc->vocab, mr);
		if (err)
			return err;
	} else {
		mr->nprompt = o->context > UINT32_MAX ? UINT32_MAX
						      : (uint32_t)o->context;
		mr->prompt = malloc(sizeof(uint32_t) * mr->nprompt);
		if (!mr->prompt)
			return -ENOMEM;
		mr->prompt[0] = 1; /* BOS */
		for (i = 1; i < mr->nprompt; i++) {
			mr->rng ^= mr->rng << 13;
			mr->rng ^= mr->rng >> 7;
			mr->rng ^= mr->rng << 17;
			mr->prompt[i] = (uint32_t)(mr->rng % mc->vocab);
		}
	}
	o->context = mr->nprompt;
	if (mc->seq_len && o->context + o->steps > mc->seq_len) {
		fprintf(stderr,
			"kvpager: a prompt of %" PRIu64 " tokens and %u to "
			"generate pass the model's context of %u tokens: "
			"shorten --prompt-tokens / --context or --generate\n",
			o->context, o->steps, mc->seq_len);
		return -EINVAL;
	}
	if (o->tokenizer) {
		err = kvp_tokenizer_load(o->tokenizer, mc->vocab, &mr->tok, why,
					 sizeof(why));
		if (err) {
			fprintf(stderr, "kvpager: %s\n", why);
			return err;
		}
	}
	if (o->logits_out && !(mr->logits = fopen(o->logits_out, "wb"))) {
		fprintf(stderr, "kvpager: cannot create --logits-out '%s': %s\n",
			o->logits_out, strerror(errno));
		return -errno;
	}
	mr->out = calloc(o->steps, sizeof(uint32_t));
	mr->gap_s = calloc(o->steps, sizeof(double));
	return mr->out && mr->gap_s ? 0 : -ENOMEM;
}

/* The prefix cache of --cache-dir or KVP_CACHE_DIR (model runs only),
 * for the final geometry g.  Messages on stderr.  Returns the exit
 * status: 0; 2, a value refused (a key file others may read, a
 * malformed URL); 1, the directory failed (unusable, or in use), as
 * --path's does. */
static int model_cache_open(struct run_opts *o, struct model_run *mr,
			    const struct kvp_kv_geometry *g)
{
	char why[512], warn[512];
	int err = kvp_model_cache_opts_env(&o->cache, why, sizeof(why));

	if (!err && o->cache.remote_url && !o->cache.dir) {
		fprintf(stderr, "kvpager: --remote (KVP_REMOTE_URL) is a tier "
				"below the prefix cache: add --cache-dir\n");
		return 2;
	}
	if (!err && !o->cache.dir)
		return 0;
	if (!err && !mr->m) {
		/* --cache-dir without --model is refused with the options */
		fprintf(stderr, "kvpager: KVP_CACHE_DIR stores a model's KV: "
				"add --model, or unset it\n");
		return 2;
	}
	if (!err)
		err = kvp_model_cache_opts_check(&o->cache, why, sizeof(why));
	if (err) {
		fprintf(stderr, "kvpager: %s\n", why);
		return 2;
	}
	err = kvp_model_cache_open(&o->cache, mr->m, g, &mr->mc, why,
				   sizeof(why), warn, sizeof(warn));
	if (err) {
		fprintf(stderr, "kvpager: %s\n", why);
		return 1;
	}
	if (*warn)
		fprintf(stderr, "kvpager: warning: %s\n", warn);
	return 0;
}

/* The KV cache's store with a prefix cache: its backing file (in
 * co->dir) behind the prefix cache's store, so that the prefill maps the
 * chunks it finds instead of copying them (model_cache.h). */
static int cache_kv_store(struct kvp_kvcache_opts *co, struct model_run *mr,
			  struct kvp_store **out)
{
	struct kvp_kv_layout l;
	struct kvp_store *inner;
	int err = kvp_kvcache_layout_for(co, &l);

	if (!err)
		err = kvp_store_file_temp(co->dir, l.region_bytes, &inner);
	if (!err)
		err = kvp_model_cache_store(mr->mc, inner, l.block_stride, out);
	if (!err) {
		co->store = *out;
		mr->kv_store = *out;
	}
	return err;
}

/* The cache's lines of the report (text, or JSON fields with a comma
 * after each).  tokens: generated tokens. */
static void cache_report(const struct run_opts *o, const struct model_run *mr,
			 uint32_t tokens)
{
	struct kvp_cache_stats cs;
	struct kvp_prefix_stats ps;
	struct kvp_cache_store_stats ss = { 0 };
	double wa, per_tok;

	if (!mr->mc)
		return;
	kvp_model_cache_stats(mr->mc, &cs, &ps);
	if (mr->kv_store)
		kvp_cache_store_stats(mr->kv_store, &ss);
	wa = cs.payload_written ? (double)cs.bytes_written / cs.payload_written
				: 0;
	per_tok = tokens ? (double)cs.bytes_written / tokens : 0;
	if (o->json) {
		printf("\"prefix_mapped_tokens\":%" PRIu64
		       ",\"cache_mapped_bytes_read\":%" PRIu64
		       ",\"cache_mapped_verified\":%" PRIu64
		       ",\"cache_mapped_verified_ahead\":%" PRIu64
		       ",\"cache_mapped_rejected\":%" PRIu64 ",",
		       kvp_model_cache_mapped_tokens(mr->mc), ss.bound_bytes,
		       ss.verified, ss.verified_ahead, ss.rejected);
		printf("\"prefix_hit_tokens\":%" PRIu64 ",\"ttft_s\":%.6f,"
		       "\"cache_hits\":%" PRIu64 ",\"cache_misses\":%" PRIu64
		       ",\"cache_bytes_read\":%" PRIu64
		       ",\"cache_bytes_written\":%" PRIu64
		       ",\"cache_payload_written\":%" PRIu64
		       ",\"cache_write_amplification\":%.4f"
		       ",\"cache_bytes_written_per_token\":%.1f"
		       ",\"cache_puts_present\":%" PRIu64
		       ",\"cache_put_errors\":%" PRIu64
		       ",\"cache_dropped_torn\":%" PRIu64
		       ",\"cache_dropped_unauth\":%" PRIu64
		       ",\"cache_dropped_foreign\":%" PRIu64
		       ",\"cache_evictions\":%" PRIu64
		       ",\"cache_disk_full\":%" PRIu64
		       ",\"cache_blocks\":%" PRIu64 ",\"cache_bytes\":%" PRIu64
		       ",\"cache_written_behind\":%" PRIu64
		       ",\"cache_behind_s\":%.6f,",
		       kvp_model_cache_hit_tokens(mr->mc), mr->ttft_s, cs.hits,
		       cs.misses, cs.bytes_read, cs.bytes_written,
		       cs.payload_written, wa, per_tok, cs.puts_present,
		       cs.put_errors, cs.dropped_torn, cs.dropped_unauth,
		       cs.dropped_foreign, cs.evictions, cs.disk_full,
		       cs.blocks, cs.bytes, ps.behind, ps.behind_s);
		return;
	}
	printf("prefix cache: %" PRIu64 " of %u prompt tokens read from the "
	       "cache, time to first token %.3f s\n",
	       kvp_model_cache_hit_tokens(mr->mc), mr->nprompt, mr->ttft_s);
	if (kvp_model_cache_mapped_tokens(mr->mc))
		printf("  mapped: %" PRIu64 " tokens' chunk files serve the KV "
		       "cache's store: %" PRIu64 " bytes read from them, %"
		       PRIu64 " chunks verified (%" PRIu64 " ahead of their "
		       "first read), %" PRIu64 " failed\n",
		       kvp_model_cache_mapped_tokens(mr->mc), ss.bound_bytes,
		       ss.verified, ss.verified_ahead, ss.rejected);
	printf("  cache: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
	       " bytes read, %" PRIu64 " written (%" PRIu64
	       " of KV: write amplification %.3f, %.0f bytes per generated "
	       "token), %" PRIu64 " already stored, %" PRIu64
	       " put errors\n",
	       cs.hits, cs.misses, cs.bytes_read, cs.bytes_written,
	       cs.payload_written, wa, per_tok, cs.puts_present,
	       cs.put_errors);
	printf("  cache: %" PRIu64 " blocks (%" PRIu64 " bytes), dropped %"
	       PRIu64 " torn, %" PRIu64 " unauthenticated, %" PRIu64
	       " foreign; %" PRIu64 " evictions (%" PRIu64 " puts found the "
	       "disk full)\n",
	       cs.blocks, cs.bytes, cs.dropped_torn, cs.dropped_unauth,
	       cs.dropped_foreign, cs.evictions, cs.disk_full);
	if (ps.behind)
		printf("  written behind the first token: %" PRIu64
		       " chunks, done %.3f s after it\n",
		       ps.behind, ps.behind_s);
}

/* The remote tier's lines of the report (text, or JSON fields with a
 * comma after each). */
static void remote_report(const struct run_opts *o, const struct model_run *mr)
{
	struct kvp_model_remote *rm = mr->mc ? kvp_model_cache_remote(mr->mc)
					     : NULL;
	struct kvp_model_remote_stats ms;
	struct kvp_remote_stats rs;

	if (!rm)
		return;
	/* the publishes still queued first (close would wait for them
	 * anyway): the report counts every one, done or failed */
	kvp_remote_flush(kvp_model_remote_tier(rm), 30000);
	kvp_model_remote_stats(rm, &ms, &rs);
	if (o->json) {
		printf("\"remote_chunks_fetched\":%" PRIu64
		       ",\"remote_chunks_mapped\":%" PRIu64
		       ",\"remote_chunks_not_stored\":%" PRIu64
		       ",\"remote_chunks_missed\":%" PRIu64
		       ",\"remote_chunks_published\":%" PRIu64
		       ",\"remote_publishes_skipped\":%" PRIu64
		       ",\"remote_hits\":%" PRIu64 ",\"remote_misses\":%" PRIu64
		       ",\"remote_verify_failed\":%" PRIu64
		       ",\"remote_errors\":%" PRIu64
		       ",\"remote_timeouts\":%" PRIu64
		       ",\"remote_bytes_read\":%" PRIu64
		       ",\"remote_publishes\":%" PRIu64
		       ",\"remote_publish_errors\":%" PRIu64
		       ",\"remote_bytes_written\":%" PRIu64 ",",
		       ms.chunks_fetched, ms.chunks_mapped, ms.dir_skipped,
		       ms.chunks_missed, ms.chunks_published,
		       ms.publish_skipped + rs.publishes_skipped_total,
		       rs.hits_total, rs.misses_total, rs.verify_failed_total,
		       rs.errors_total, rs.timeouts_total, rs.bytes_read_total,
		       rs.publishes_total, rs.publish_errors_total,
		       rs.bytes_written_total);
		return;
	}
	printf("  remote %s: %" PRIu64 " chunks fetched (%" PRIu64
	       " mapped, %" PRIu64 " not stored locally), %" PRIu64
	       " missed; %" PRIu64 " offered, %" PRIu64
	       " skipped (queue full, or past queue_bytes)\n",
	       kvp_model_remote_url(rm), ms.chunks_fetched, ms.chunks_mapped,
	       ms.dir_skipped, ms.chunks_missed, ms.chunks_published,
	       ms.publish_skipped);
	printf("  remote: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
	       " failed verification, %" PRIu64 " errors (%" PRIu64
	       " timeouts), %" PRIu64 " bytes read; %" PRIu64
	       " published so far, %" PRIu64 " publish errors\n",
	       rs.hits_total, rs.misses_total, rs.verify_failed_total,
	       rs.errors_total, rs.timeouts_total, rs.bytes_read_total,
	       rs.publishes_total, rs.publish_errors_total);
}

/* One generated token: chosen from the logits, kept, then appended. */
static int model_next(struct run_opts *o, struct model_run *mr, uint32_t i,
		      bool measured)
{
	const struct kvp_model_config *mc = kvp_model_config(mr->m);
	const float *l = kvp_model_logits(mr->seq);
	double c0 = kvp_model_seq_compute_s(mr->seq), t0 = now_s();
	int err;

	mr->out[i] = kvp_model_sample(l, mc->vocab, (float)o->temperature,
				      &mr->rng);
	if (mr->logits &&
	    fwrite(l, sizeof(float), mc->vocab, mr->logits) != mc->vocab) {
		fprintf(stderr, "kvpager: cannot write --logits-out '%s': %s\n",
			o->logits_out, strerror(errno));
		return -EIO;
	}
	err = kvp_model_step(mr->seq, mr->out[i], NULL);
	mr->gap_s[i] = now_s() - mr->t_tok;
	mr->t_tok += mr->gap_s[i];
	if (measured) {
		mr->t_wall_s += now_s() - t0;
		mr->t_model_s += kvp_model_seq_compute_s(mr->seq) - c0;
	}
	return err;
}

/* s as a JSON string. */
static void json_str(const char *s);

/* The device path's figures (--device), over all steps: JSON fields,
 * or a line. */
static void device_report(const struct kvp_kvcache *c, bool json)
{
	struct kvp_kvcache_device_stats ds;
	double seen;

	if (kvp_kvcache_device_stats(c, &ds)) {
		if (json)
			printf("\"device\":\"cpu\",");
		return;
	}
	seen = (double)(ds.reused + ds.copied);
	if (json) {
		printf("\"device\":");
		json_str(ds.name);
		printf(",\"device_pool_slots\":%u,\"device_bytes\":%" PRIu64
		       ",\"device_staging_bytes\":%" PRIu64
		       ",\"device_blocks_reused\":%" PRIu64
		       ",\"device_blocks_copied\":%" PRIu64
		       ",\"device_reuse_rate\":%.4f"
		       ",\"device_bytes_to_device\":%" PRIu64
		       ",\"device_overlap_misses\":%" PRIu64
		       ",\"device_t_stage_s\":%.6f,\"device_t_sync_s\":%.6f,",
		       ds.pool_slots, ds.device_bytes, ds.staging_bytes,
		       ds.reused, ds.copied, seen > 0 ? ds.reused / seen : 0,
		       ds.bytes_to_device, ds.overlap_misses, ds.t_stage_s,
		       ds.t_sync_s);
		return;
	}
	printf("  device %s: pool %u blocks, %.1f MiB on the device, %.1f MiB "
	       "page-locked staging; blocks reused %" PRIu64 ", copied %" PRIu64
	       " (%.1f%% reused), %.1f MiB to the device, staging copy "
	       "%.3f s, overlap misses %" PRIu64 " (all steps)\n",
	       ds.name, ds.pool_slots, ds.device_bytes / 1048576.0,
	       ds.staging_bytes / 1048576.0, ds.reused, ds.copied,
	       seen > 0 ? 100.0 * ds.reused / seen : 0,
	       ds.bytes_to_device / 1048576.0, ds.t_stage_s,
	       ds.overlap_misses);
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

/* The model's part of the report: the @done tokens made (fewer than
 * --generate when the run was stopped). */
static void model_report(const struct run_opts *o, const struct model_run *mr,
			 uint32_t done)
{
	uint32_t i;

	if (o->json) {
		printf("\"model\":");
		json_str(o->model);
		printf(",\"prompt_tokens\":%u,\"tokens\":[", mr->nprompt);
		for (i = 0; i < done; i++)
			printf("%s%u", i ? "," : "", mr->out[i]);
		printf("],\"prefill_restore_s\":%.6f,\"prefill_math_s\":%.6f,"
		       "\"prefill_offer_s\":%.6f,\"prefill_kv_s\":%.6f,"
		       "\"prefill_computed_tokens\":%u,"
		       "\"offer_after_first_token_s\":%.6f,",
		       mr->pt.restore_s, mr->pt.math_s, mr->pt.offer_s,
		       mr->pt.kv_s, mr->pt.computed_tokens,
		       mr->pt.offer_after_s);
		/* token k+1 after token k, the first's wait included */
		printf("\"inter_token_s\":[");
		for (i = 0; i < done; i++)
			printf("%s%.6f", i ? "," : "", mr->gap_s[i]);
		printf("],");
		return;
	}
	printf("tokens:");
	for (i = 0; i < done; i++)
		printf(" %u", mr->out[i]);
	printf("\n");
	printf("prefill: %u tokens computed: model %.3f s, into the KV cache "
	       "%.3f s, offered to the prefix cache %.3f s; %u taken from the "
	       "prefix cache in %.3f s\n",
	       mr->pt.computed_tokens, mr->pt.math_s, mr->pt.kv_s,
	       mr->pt.offer_s, mr->pt.restored_tokens, mr->pt.restore_s);
	if (mr->pt.offer_after_s > 0)
		printf("prefix cache: computed chunks read back from the KV "
		       "cache and offered after the first token in %.3f s\n",
		       mr->pt.offer_after_s);
	if (mr->tok) {
		printf("text: ");
		for (i = 0; i < done; i++)
			fputs(kvp_tokenizer_piece(
				  mr->tok,
				  i ? mr->out[i - 1]
				    : mr->prompt[mr->nprompt - 1],
				  mr->out[i]),
			      stdout);
		printf("\n");
	}
}

/* A --metrics-listen (or KVP_METRICS_LISTEN) that is no address is the
 * command line's error, said before anything runs; a port that cannot be
 * taken is found when the instance listens. */
static int metrics_check(const struct run_opts *o)
{
	const char *a = o->metrics_listen ? o->metrics_listen
					  : getenv("KVP_METRICS_LISTEN");
	char why[KVP_TUNABLE_ERR_MAX];
	struct sockaddr_storage ss;
	size_t len;

	if (!a || !*a ||
	    !kvp_metrics_http_parse(a, &ss, &len, why, sizeof(why)))
		return 0;
	fprintf(stderr, "kvpager: %s\n", why);
	return -EINVAL;
}

/* The run; what the model run holds is freed by run(), on every path. */
static int run_job(int argc, char **argv, struct model_run *mr)
{
	struct run_opts o = {
		.preset = "llama3-8b",
		.context = 32768,
		.batch = 1,
		.steps = 16,
		.warmup = 2,
		.sample_every = 4,
		.sample_layers = 4,
		.seed = 1,
	};
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy = NULL;
	struct kvp_kv_source src;
	struct kvp_kvcache_opts co;
	struct kvp_config cfg;
	struct kvp_kv_config kv, kv_start;
	struct kvp_kvcache *c = NULL;
	struct kvp_store *kv_store = NULL; /* with a prefix cache */
	struct kvp_instance *inst = NULL;
	struct kvp_fuse_view *view = NULL;
	struct kvp_view *tree = NULL;
	struct live_kv lv = { .mu = PTHREAD_MUTEX_INITIALIZER };
	char why[512];
	struct kvp_kvcache_stats s_warm, s_end;
	struct kvp_kvcache_ram ram;
	struct kvp_kvcache_step_stats d;
	struct pf_counts pf_warm, pf_end;
	struct kvp_progress bar = { 0 };
	struct kvp_timeline tl = { 0 }; /* --plot's steps */
	struct kvp_kvcache_stats s_prev;
	char plot_title[320] = "";
	uint32_t *ids = NULL, i, done_steps = 0, changes = 0, plot_warm = 0;
	uint64_t kv_bytes, capacity;
	double t_open, t_prefill, t_decode, t_quality = 0, t0, t1, busy;
	double recall = 0, rel = 0, mass = 0;
	uint32_t nsamp = 0;
	char h1[32], h2[32], h3[32], h4[32], h5[32];
	int err, e2, status = 1;

	if (parse_args(argc, argv, &o))
		return 2;
	/* before the run: a plot that cannot be made is said now */
	if (o.plot && kvp_plot_check("kvpager", o.plot))
		return 2;
	if (metrics_check(&o))
		return 2;
	if (o.model) {
		if (model_open(&o, mr, &g))
			return 2;
		o.preset = kvp_model_name(mr->m);
	} else if (kvp_kv_geometry_preset(o.preset, &g)) {
		fprintf(stderr, "kvpager: unknown preset '%s'\n", o.preset);
		usage(stderr);
		return 2;
	}
	if (__builtin_mul_overflow(o.context, (uint64_t)o.batch, &kv_bytes) ||
	    __builtin_mul_overflow(kv_bytes, kvp_kv_token_bytes(&g),
				   &kv_bytes)) {
		fprintf(stderr,
			"kvpager: --context %" PRIu64 " x --batch %u tokens of "
			"%s is more KV than 64-bit sizes hold\n",
			o.context, o.batch, o.preset);
		return 2;
	}
	if (configure(&o, kv_bytes, &cfg, &kv))
		return 2;
	g.block_tokens = (uint32_t)kv.kv_block_tokens;
	if (kvp_kv_geometry_check(&g)) {
		fprintf(stderr,
			"kvpager: %u tokens per KV block do not fit %s %s "
			"(set --block-tokens)\n",
			g.block_tokens, o.model ? "model" : "preset",
			o.preset);
		return 2;
	}
	if (check_geometry(&o, &g, &kv))
		return 2;
	/* Before the prefix cache starts its threads: they inherit the
	 * blocked signals, so that SIGINT and SIGTERM reach the thread that
	 * stops the run cleanly. */
	err = signals_take();
	if (err) {
		fprintf(stderr, "kvpager: cannot take SIGINT and SIGTERM: %s\n",
			kvp_strerror(err));
		return 1;
	}
	err = model_cache_open(&o, mr, &g);
	if (err)
		return err;
	kv_start = kv;
	capacity = (o.context + o.steps + g.block_tokens) * o.batch;
	if (!o.block && kv.predictor == KVP_PREDICTOR_EXACT)
		o.block = exact_pager_block(&g, capacity);

	kvp_kv_synth_opts_default(&so);
	so.seed = o.seed;
	err = mr->m ? 0 : kvp_kv_synth_create(&g, &so, &sy);
	if (err) {
		fprintf(stderr, "kvpager: cannot create the synthetic KV: %s\n",
			kvp_strerror(err));
		return 1;
	}
	if (sy)
		kvp_kv_source_synth(&src, sy);

	kvp_kvcache_opts_default(&co, &g);
	co.max_seqs = o.batch;
	co.capacity_tokens = capacity;
	co.pager_block_bytes = (size_t)o.block;
	co.dir = o.path;
	co.budget_bytes = cfg.ram_budget_bytes;
	co.prefetch = kv.prefetch_depth_layers > 0;
	co.prefetch_depth = co.prefetch ? (uint32_t)kv.prefetch_depth_layers : 1;
	kvp_predictor_opts_default(&co.pred,
				   (enum kvp_predictor_kind)kv.predictor);
	co.pred.budget_tokens = (uint32_t)kv.predict_budget_tokens;
	co.pred.sink_tokens = (uint32_t)kv.sink_tokens;
	co.pred.rank = (uint32_t)kv.lowrank_rank;
	co.pred.fit_tokens = (uint32_t)kv.lowrank_fit_tokens;
	co.pred.max_seqs = o.batch;
	co.attn_threads = (unsigned)kv.attention_threads;
	co.sample_every = o.sample_every;
	co.sample_layers = o.sample_layers;
	co.max_samples = 4096;
	co.device = o.device;
	co.device_pool_bytes = o.device_pool;
	{
		char msg[512];

		err = kvp_kvcache_device_probe(o.device, msg, sizeof(msg));
		if (err) {
			fprintf(stderr, "kvpager: %s\n", msg);
			kvp_kv_synth_destroy(sy);
			return err == -EINVAL ? 2 : 1; /* a name that is none */
		}
	}
	/* a pool too small for one layer's chosen blocks would fail the
	 * first step that chooses more: refused before the run */
	if (kvp_kv_device_pool_check("kvpager", &co, o.context + o.steps)) {
		kvp_kv_synth_destroy(sy);
		return 2;
	}
	t0 = now_s();
	/* The pager comes from the instance (the variables were read above),
	 * KVP_FUSE_MOUNT mounts the debug view for kvpctl, and
	 * --metrics-listen or KVP_METRICS_LISTEN serves /metrics. */
	err = kvp_instance_open(
	    &(struct kvp_instance_opts){ .cfg = &cfg,
					 .kv = &kv,
					 .no_env = true,
					 .metrics_listen = o.metrics_listen },
	    &inst, why, sizeof(why));
	if (err) {
		fprintf(stderr, "kvpager: %s\n", why);
		kvp_kv_synth_destroy(sy);
		return 1;
	}
	if (kvp_instance_metrics_url(inst))
		fprintf(stderr, "kvpager: metrics at %s\n",
			kvp_instance_metrics_url(inst));
	co.pager = kvp_instance_pager(inst);
	err = mr->mc ? cache_kv_store(&co, mr, &kv_store) : 0;
	if (!err)
		err = kvp_kvcache_create(&co, &c);
	t_open = now_s() - t0;
	if (err) {
		kvp_store_destroy(kv_store);
		fprintf(stderr,
			"kvpager: cannot set up the KV cache (%s of KV for "
			"%" PRIu64 " tokens in %s): %s\n",
			kvp_cli_human((double)(co.capacity_tokens *
					       kvp_kv_token_bytes(&g)),
				      h1, sizeof(h1)),
			co.capacity_tokens, o.path ? o.path : "$TMPDIR",
			kvp_strerror(err));
		kvp_instance_close(inst);
		kvp_kv_synth_destroy(sy);
		return 1;
	}
	warn_budget(&o, &kv, c, cfg.ram_budget_bytes);
	lv.c = c;
	view = kvp_instance_view(inst);
	if (view) {
		kvp_view_set_seqs(kvp_fuse_view_tree(view), &kv_seq_ops, c);
		kvp_view_set_kv(kvp_fuse_view_tree(view), &kv, live_apply, &lv);
	}
	/* the tiers' figures: in the view and in /metrics over HTTP */
	tree = kvp_instance_tree(inst);
	if (mr->mc) {
		kvp_view_set_cache(tree, kvp_model_cache_dir(mr->mc));
		if (kvp_model_cache_remote(mr->mc))
			kvp_view_set_remote(tree, kvp_model_remote_tier(
						      kvp_model_cache_remote(mr->mc)));
	}
	ids = calloc(o.batch, sizeof(*ids));
	if (!ids || (o.plot && kvp_timeline_init(&tl, KVP_TIMELINE_POINTS))) {
		fprintf(stderr, "kvpager: out of memory\n");
		goto out;
	}

	/* prefill */
	t0 = now_s();
	kvp_progress_start(&bar, "kvpager", "prefill", o.quiet);
	for (i = 0; i < o.batch && !stopped(); i++) {
		err = kvp_kvcache_seq_create(c, &ids[i]);
		if (!err && mr->m) {
			err = kvp_model_seq_create(mr->m, c, ids[i],
						   co.attn_threads, &mr->seq);
			if (!err)
				kvp_model_seq_set_progress(
				    mr->seq, model_prefill_progress, &bar);
			if (!err && mr->mc)
				err = kvp_model_cache_attach(
				    mr->mc, mr->seq, mr->prompt, mr->nprompt);
			if (!err)
				err = kvp_model_prefill(mr->seq, mr->prompt,
							mr->nprompt);
			/* its logits give the first token */
			mr->ttft_s = now_s() - t0;
			mr->t_tok = t0 + mr->ttft_s;
			/* the chunks it computed: offered and stored now */
			if (mr->mc && !err &&
			    (e2 = kvp_model_cache_first_token(mr->mc)))
				fprintf(stderr,
					"kvpager: prefix cache: the computed "
					"chunks were not read back to be "
					"stored: %s (they are computed again "
					"next time)\n",
					kvp_strerror(e2));
			else if (mr->mc && err) /* what it queued */
				kvp_model_cache_first_token(mr->mc);
			if (mr->seq)
				kvp_model_seq_prefill_times(mr->seq, &mr->pt);
		} else if (!err)
			err = kvp_kvcache_prefill(
			    c, ids[i], o.context, &src,
			    o.batch == 1 ? prefill_progress : NULL, &bar);
		if (err) {
			fprintf(stderr,
				"kvpager: prefill of sequence %u failed: %s\n",
				i, kvp_strerror(err));
			goto out;
		}
		if (o.batch > 1)
			kvp_progress_update(&bar, i + 1, o.batch, "sequences");
	}
	t_prefill = now_s() - t0;
	if (!stopped() && o.ram && fit_ram(c, o.ram, o.steps))
		goto out;
	if (stopped()) {
		fprintf(stderr,
			"kvpager: interrupted during the prefill (%u of %u "
			"sequences): nothing to report\n",
			i, o.batch);
		goto out;
	}

	/* decode */
	t0 = now_s();
	kvp_progress_start(&bar, "kvpager", "decode", o.quiet);
	memset(&s_warm, 0, sizeof(s_warm));
	memset(&pf_warm, 0, sizeof(pf_warm));
	kvp_kvcache_stats(c, &s_prev);
	for (i = 0; i < o.steps && !stopped(); i++) {
		if (i == o.warmup) {
			kvp_kvcache_stats(c, &s_warm);
			pf_snapshot(c, &s_warm, &pf_warm);
		}
		changes += live_take(&lv, view, i, &kv);
		t1 = now_s();
		if (mr->m)
			err = model_next(&o, mr, i, i >= o.warmup);
		else
			err = kvp_kvcache_step(c, ids, o.batch, &src, NULL,
					       NULL);
		if (err) {
			fprintf(stderr, "kvpager: decode step %u failed: %s\n",
				i, kvp_strerror(err));
			goto out;
		}
		if (o.plot)
			timeline_step(&tl, c, &s_prev, now_s() - t1,
				      mr->m != NULL);
		done_steps = i + 1;
		kvp_progress_update(&bar, i + 1, o.steps, "steps");
	}
	kvp_kvcache_stats(c, &s_end);
	pf_snapshot(c, &s_end, &pf_end);
	kvp_kvcache_ram(c, &ram);
	t_decode = now_s() - t0;
	if (mr->mc) { /* the figures count every chunk written */
		kvp_model_cache_drain(mr->mc);
		/* with the read-back's time, its thread done */
		if (mr->seq)
			kvp_model_seq_prefill_times(mr->seq, &mr->pt);
	}
	if (stopped()) {
		kvp_progress_done(&bar, done_steps, o.steps, "steps");
		fprintf(stderr,
			"kvpager: interrupted after %u of %u decode steps; the "
			"report covers those, without scoring\n",
			done_steps, o.steps);
	} else {
		t0 = now_s();
		err = kvp_kvcache_quality(c, &recall, &rel, &mass, &nsamp);
		t_quality = now_s() - t0;
		if (err) {
			fprintf(stderr,
				"kvpager: scoring against exact attention "
				"failed: %s\n",
				kvp_strerror(err));
			goto out;
		}
	}

	d = s_end.sum;
	sub_stats(&d, &s_warm.sum);
	pf_sub(&pf_end, &pf_warm);
	busy = s_end.t_load_busy_s - s_warm.t_load_busy_s;
	{
		double n = d.steps ? (double)d.steps : 1;
		double tstep = d.t_step_s / n;
		double tcomp = (d.t_compute_s + d.t_predict_s + d.t_fill_s) / n;
		double tload, mx, eff, tps;
		double reuse = d.chosen_blocks
				   ? (double)d.reused_blocks / d.chosen_blocks
				   : 0;
		struct kvp_region *r = kvp_kvcache_region(c);
		const char *imode = r ? kvp_region_install_mode(r) : "-";
		const char *pk = kvp_predictor_kind_name(
		    (enum kvp_predictor_kind)kv.predictor);
		uint64_t pbb = kvp_kvcache_layout(c)->pager_block_bytes;
		uint32_t warm = done_steps > o.warmup ? o.warmup : done_steps;

		/* the model finishes its last layer and the logits outside
		 * the cache's step: a token takes the whole model step */
		if (mr->m) {
			tstep = mr->t_wall_s / n;
			tcomp += (mr->t_wall_s - d.t_step_s) / n;
		}
		tload = busy / n;
		mx = tcomp > tload ? tcomp : tload;
		eff = tstep > 0 ? mx / tstep : 0;
		tps = tstep > 0 ? d.tokens / n / tstep : 0;
		plot_warm = warm;
		snprintf(
		    plot_title, sizeof(plot_title),
		    "kvpager run: %s, context %" PRIu64 " x %u, predictor "
		    "%s, prefetch depth %" PRIu64 ", budget %s of %s of "
		    "%s KV: %.2f tokens/s",
		    o.preset, o.context, o.batch, pk, kv.prefetch_depth_layers,
		    kvp_cli_human((double)cfg.ram_budget_bytes, h1, sizeof(h1)),
		    kvp_cli_human((double)kv_bytes, h2, sizeof(h2)),
		    mr->m ? "the model's" : "synthetic", tps);

		if (o.json) {
			putchar('{');
			if (mr->m)
				model_report(&o, mr, done_steps);
			cache_report(&o, mr, done_steps);
			remote_report(&o, mr);
			device_report(c, true);
			printf(
			    "\"preset\":\"%s\",\"context\":%" PRIu64
			    ",\"batch\":%u,\"predictor\":\"%s\","
			    "\"predictor_at_start\":\"%s\","
			    "\"kv_config_changes\":%u,"
			    "\"budget_bytes\":%" PRIu64 ",\"kv_bytes\":%" PRIu64
			    ",\"synthetic_kv\":%s,\"steps\":%u,"
			    "\"steps_done\":%u,\"interrupted\":%s,"
			    "\"warmup_steps\":%u,\"measured_steps\":%" PRIu64
			    ",\"tokens_per_s\":%.4f,\"t_step_s\":%.6f,"
			    "\"t_compute_s\":%.6f,\"t_load_s\":%.6f,"
			    "\"t_wait_s\":%.6f,"
			    "\"overlap_efficiency\":%.4f,"
			    "\"t_step_over_max\":%.4f,"
			    "\"bytes_read_per_step\":%.1f,"
			    "\"bytes_written_per_step\":%.1f,"
			    "\"demand_faults_per_step\":%.3f,"
			    "\"prefetch_asked\":%" PRIu64
			    ",\"prefetch_issued\":%" PRIu64
			    ",\"prefetch_hit\":%" PRIu64
			    ",\"prefetch_late\":%" PRIu64
			    ",\"prefetch_wasted\":%" PRIu64
			    ",\"prefetch_open\":%" PRId64
			    ",\"reuse_rate\":%.4f,\"recall\":%.4f,"
			    "\"rel_error\":%.5f,\"chosen_mass\":%.4f,"
			    "\"quality_samples\":%u,"
			    "\"pager_block_bytes\":%" PRIu64
			    ",\"prefetch_depth_layers\":%" PRIu64 ","
			    "\"predict_budget_tokens\":%" PRIu64 ","
			    "\"lowrank_rank\":%" PRIu64 ","
			    "\"install_mode\":\"%s\","
			    "\"metadata_bytes\":%zu,"
			    "\"t_open_s\":%.3f,\"t_prefill_s\":%.3f,"
			    "\"t_decode_s\":%.3f,\"t_quality_s\":%.3f,"
			    "\"rolling_flush_store\":%" PRIu64
			    ",\"rolling_flush_region\":%" PRIu64
			    ",\"ram_frames_bytes\":%" PRIu64
			    ",\"ram_metadata_bytes\":%" PRIu64
			    ",\"ram_rolling_bytes\":%" PRIu64
			    ",\"ram_staging_bytes\":%" PRIu64
			    ",\"ram_total_bytes\":%" PRIu64 "}\n",
			    o.preset, o.context, o.batch, pk,
			    kvp_predictor_kind_name(
				(enum kvp_predictor_kind)kv_start.predictor),
			    changes, cfg.ram_budget_bytes, kv_bytes,
			    mr->m ? "false" : "true", o.steps,
			    done_steps, stopped() ? "true" : "false", warm,
			    d.steps, tps, tstep, tcomp, tload, d.t_wait_s / n,
			    eff, mx > 0 ? tstep / mx : 0, d.bytes_read / n,
			    d.bytes_written / n, d.demand_faults / n,
			    pf_end.asked, pf_end.loaded, pf_end.hit,
			    pf_end.late, pf_end.wasted, pf_open(&pf_end),
			    reuse, recall, rel, mass, nsamp, pbb,
			    kv.prefetch_depth_layers, kv.predict_budget_tokens,
			    kv.lowrank_rank, imode,
			    kvp_predictor_metadata_bytes(
				kvp_kvcache_predictor(c)),
			    t_open, t_prefill, t_decode, t_quality,
			    s_end.sum.flush_store, s_end.sum.flush_region,
			    ram.frames, ram.metadata, ram.rolling, ram.staging,
			    ram.total);
		} else {
			printf("kvpager run: %s (%u layers, %u q heads, %u KV "
			       "heads, head dim %u, %s, G=%u), context %" PRIu64
			       ", batch %u, predictor %s",
			       o.preset, g.layers, g.q_heads, g.kv_heads,
			       g.head_dim, kvp_kv_dtype_name(g.dtype),
			       g.block_tokens, o.context, o.batch, pk);
			if (kv.predictor != KVP_PREDICTOR_EXACT)
				printf(" (M=%" PRIu64 " tokens per layer)",
				       kv.predict_budget_tokens);
			if (changes)
				printf(", %s at the start (%u changes "
				       "through the view)",
				       kvp_predictor_kind_name(
					   (enum kvp_predictor_kind)
					       kv_start.predictor),
				       changes);
			if (mr->m)
				printf(
				    "\n  KV %s, made by the model (dim %u, "
				    "hidden %u, %s of weights), prompt %u "
				    "tokens\n",
				    kvp_cli_human((double)kv_bytes, h1,
						  sizeof(h1)),
				    kvp_model_config(mr->m)->dim,
				    kvp_model_config(mr->m)->hidden_dim,
				    kvp_cli_human(
					(double)kvp_model_weight_bytes(mr->m),
					h2, sizeof(h2)),
				    mr->nprompt);
			else
				printf("\n  KV %s, SYNTHETIC (sink tokens, "
				       "recent window, heavy hitters, topic "
				       "clusters; no model runs)\n",
				       kvp_cli_human((double)kv_bytes, h1,
						     sizeof(h1)));
			printf(
			    "  budget %s (%.1f%% of the KV), pager block %s, "
			    "install %s, prefetch %s\n",
			    kvp_cli_human((double)cfg.ram_budget_bytes, h2,
					  sizeof(h2)),
			    100.0 * cfg.ram_budget_bytes / kv_bytes,
			    kvp_cli_human((double)pbb, h3, sizeof(h3)), imode,
			    kv.prefetch_depth_layers ? "layer-ahead"
						     : "off (demand)");
			if (kv.prefetch_depth_layers)
				printf("  prefetch depth %" PRIu64 " layers\n",
				       kv.prefetch_depth_layers);
			printf("phases: set-up %.2f s, prefill %.2f s (%.2f "
			       "GB/s of KV), decode %.2f s (%u steps), "
			       "scoring %.2f s\n",
			       t_open, t_prefill,
			       t_prefill > 0 ? kv_bytes / t_prefill / 1e9 : 0,
			       t_decode, done_steps, t_quality);
			printf("decode, %" PRIu64 " steps after %u warm-up:\n",
			       d.steps, warm);
			printf("  tokens/s              %.3f\n", tps);
			printf("  T_step                %.4f s\n", tstep);
			printf("  T_compute             %.4f s (attention "
			       "%.4f, predictor %.4f, %s %.4f)\n",
			       tcomp, d.t_compute_s / n, d.t_predict_s / n,
			       mr->m ? "model" : "new K/V",
			       mr->m ? mr->t_model_s / n : d.t_fill_s / n);
			printf("  T_load                %.4f s (time with a "
			       "prefetch outstanding)\n",
			       tload);
			printf("  max(T_compute,T_load) %.4f s: T_step is "
			       "%.3fx of it, overlap efficiency %.3f\n",
			       mx, mx > 0 ? tstep / mx : 0, eff);
			printf("  waiting on loads      %.4f s/step\n",
			       d.t_wait_s / n);
			printf("  bytes read/step       %s\n",
			       kvp_cli_human(d.bytes_read / n, h1, sizeof(h1)));
			printf("  demand faults/step    %.2f\n",
			       d.demand_faults / n);
			print_prefetch(&pf_end);
			printf("  reuse rate            %.3f (chosen blocks "
			       "already resident)\n",
			       reuse);
			device_report(c, false);
			printf("  recall                %.4f of the oracle's "
			       "top-k attention mass (chosen mass %.4f)\n",
			       recall, mass);
			printf("  rel_error             %.5f (output vs exact "
			       "attention, %u sampled layer-steps)\n",
			       rel, nsamp);
			if (kvp_predictor_metadata_bytes(
				kvp_kvcache_predictor(c)))
				printf("  predictor metadata    %s resident\n",
				       kvp_cli_human(
					   (double)kvp_predictor_metadata_bytes(
					       kvp_kvcache_predictor(c)),
					   h1, sizeof(h1)));
			printf("  rolling blocks        %" PRIu64
			       " written to the store, %" PRIu64
			       " through the region\n",
			       s_end.sum.flush_store, s_end.sum.flush_region);
			if (ram.slots)
				printf(
				    "  reuse slots           %s of the frames: "
				    "%" PRIu64
				    " blocks read into them in %" PRIu64
				    " I/Os, %" PRIu64
				    " blocks' reads failed (the region read"
				    " those)\n",
				    kvp_cli_human((double)ram.slots, h1,
						  sizeof(h1)),
				    s_end.slot_reads, s_end.slot_ios,
				    s_end.slot_read_errors);
			printf(
			    "  RAM                   %s in all: frames %s "
			    "(the budget), predictor metadata %s, rolling "
			    "buffers %s, staging %s (all but the frames "
			    "outside the budget)\n",
			    kvp_cli_human((double)ram.total, h1, sizeof(h1)),
			    kvp_cli_human((double)ram.frames, h2, sizeof(h2)),
			    kvp_cli_human((double)ram.metadata, h3, sizeof(h3)),
			    kvp_cli_human((double)ram.rolling, h4, sizeof(h4)),
			    kvp_cli_human((double)ram.staging, h5, sizeof(h5)));
			if (mr->m)
				model_report(&o, mr, done_steps);
			cache_report(&o, mr, done_steps);
			remote_report(&o, mr);
		}
	}
	status = 0;
out:
	if (view) {
		/* no view callback runs past this point */
		kvp_view_set_kv(kvp_fuse_view_tree(view), NULL, NULL, NULL);
		kvp_view_set_seqs(kvp_fuse_view_tree(view), NULL, NULL);
	}
	if (tree) {
		kvp_view_set_cache(tree, NULL);
		kvp_view_set_remote(tree, NULL);
	}
	/* Before the KV cache: its destroy joins the thread that reads the
	 * held-back chunks back from it (every exit, not only the drain). */
	kvp_model_seq_destroy(mr->seq);
	mr->seq = NULL;
	kvp_kvcache_destroy(c);
	kvp_store_destroy(kv_store); /* after the region it backs */
	kvp_instance_close(inst);
	kvp_kv_synth_destroy(sy);
	free(ids);
	/* drawn once the pager is gone, its threads and files with it; a
	 * plot that failed says so, the figures above stand */
	if (!status && o.plot &&
	    kvp_timeline_plot(&tl, o.plot, plot_title, plot_warm, "kvpager"))
		status = 1;
	kvp_timeline_free(&tl);
	fflush(stdout);
	if (stopped())
		return 128 + atomic_load(&stop_signal);
	return status;
}

static int run(int argc, char **argv)
{
	struct model_run mr = { 0 };
	int rc = run_job(argc, argv, &mr);

	model_run_free(&mr);
	return rc;
}

int main(int argc, char **argv)
{
	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_cmds_print(stdout, NULL, commands);
		kvp_cli_table_print(stdout, "run", cli_table());
		return 0;
	}
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "run"))
		return run(argc - 1, argv + 1);
	fprintf(stderr, "kvpager: unknown command '%s' (try: kvpager run)\n",
		argv[1]);
	return 2;
}
