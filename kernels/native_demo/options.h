// kvdemo: command-line options. Bad usage prints one line (and the usage) to stderr and exits 2.
#pragma once

#include <cstdint>
#include <string>

namespace kvdemo {

struct Options {
    std::string schedule, layout, dispatch;
    int layers = 2, ctx = 2048, np = 2, ubatch = 512, head_dim = 256, n_head = 4, n_head_kv = 2;
    int pool_mib = 4, prompt = 600, decode = 8;
    uint32_t seed = 1;
};

[[noreturn]] void usage(const std::string & msg);
Options parse(int argc, char ** argv);

}  // namespace kvdemo
