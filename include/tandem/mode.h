// Mode: how tandem runs a workload's training step. One typed value, parsed and named in one
// place (src/mode.cpp): the CLI's help and error texts, the runner and the tests all read it
// from here, so a new mode is one enumerator plus one row of kModeInfo.
#pragma once

#include <string>
#include <vector>

namespace tandem {

enum class Mode {
  kSerial,            ///< every stage of step n, in order, on one lane: the baseline
  kPipelined,         ///< each stage on its own lane and host thread, step n+1 beside step n
  kGraphed,           ///< one lane; the stages after the load captured into one CUDA graph
  kPipelinedGraphed,  ///< pipelined's lanes; each GPU stage replays its own CUDA graph
  kGraphedK,          ///< graphed, with K steps captured into one graph (K per replay)
  kAuto,              ///< short trials of every other mode, then the fastest (the runner's)
};

/// "serial", "pipelined", "graphed", "pipelined+graphed", "graphed_k" or "auto".
const char* to_string(Mode mode);
/// One line for help texts: what the mode does.
const char* describe(Mode mode);
/// The modes a workload runs, simplest first (serial, the baseline, first); auto excluded.
const std::vector<Mode>& workload_modes();
/// Parses a mode name; throws InvalidArgument naming the bad value and every valid one
/// ("mode 'fast' is not valid: expected serial, pipelined, ... or auto").
Mode parse_mode(const std::string& name);
/// "serial, pipelined, graphed, pipelined+graphed, graphed_k or auto": for help texts.
std::string mode_choices(bool with_auto = true);

/// Each stage has a lane and a host thread of its own (kPipelined, kPipelinedGraphed).
bool runs_pipelined(Mode mode);
/// Stages replay CUDA graphs (kGraphed, kPipelinedGraphed, kGraphedK).
bool captures_graphs(Mode mode);

/// "a, b or c": for error messages that list what was expected.
std::string join_choices(const std::vector<std::string>& choices);

}  // namespace tandem
