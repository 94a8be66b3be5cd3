// kvdemo: command-line options (see options.h).
#include "options.h"

#include <cstdio>
#include <cstdlib>
#include <map>

namespace kvdemo {

[[noreturn]] void usage(const std::string & msg) {
    std::fprintf(stderr, "kvdemo: %s\n", msg.c_str());
    std::fprintf(stderr, "usage: kvdemo --schedule two-slot-concurrent|slot1-first --layout shared|per-stream "
                         "--dispatch membership|fits [--layers N] [--ctx N] [--pool-mib N] [--prompt N] "
                         "[--decode N] [--ubatch N] [--n-head N] [--n-head-kv N] [--seed N]\n");
    std::exit(2);
}

Options parse(int argc, char ** argv) {
    Options o;
    std::map<std::string, int *> ints = {
        {"--layers", &o.layers}, {"--ctx", &o.ctx}, {"--pool-mib", &o.pool_mib}, {"--prompt", &o.prompt},
        {"--decode", &o.decode}, {"--ubatch", &o.ubatch}, {"--n-head", &o.n_head}, {"--n-head-kv", &o.n_head_kv}};
    std::map<std::string, std::string *> strs = {
        {"--schedule", &o.schedule}, {"--layout", &o.layout}, {"--dispatch", &o.dispatch}};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            usage(a + " needs a value");
        }
        const std::string val = argv[++i];
        if (strs.count(a)) {
            *strs[a] = val;
        } else if (ints.count(a) || a == "--seed") {
            char * end = nullptr;
            const long n = std::strtol(val.c_str(), &end, 10);
            if (*end != '\0' || n <= 0 || n > 1 << 20) {
                usage(a + ": " + val + " is not a positive integer");
            }
            if (a == "--seed") {
                o.seed = (uint32_t) n;
            } else {
                *ints[a] = (int) n;
            }
        } else {
            usage("unknown option " + a);
        }
    }
    if (o.schedule != "two-slot-concurrent" && o.schedule != "slot1-first") {
        usage("--schedule must be two-slot-concurrent or slot1-first");
    }
    if (o.layout != "shared" && o.layout != "per-stream") {
        usage("--layout must be shared or per-stream");
    }
    if (o.dispatch != "membership" && o.dispatch != "fits") {
        usage("--dispatch must be membership or fits");
    }
    if (o.n_head % o.n_head_kv != 0) {
        usage("--n-head must be a multiple of --n-head-kv");
    }
    return o;
}

}  // namespace kvdemo
