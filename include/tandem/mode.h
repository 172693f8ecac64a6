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
};
// Mode auto — short timed trials of every mode, then the fastest — is the run layer's
// (tandem/run/request.h: RunMode), not a mode a Runner runs.

/// "serial", "pipelined", "graphed", "pipelined+graphed" or "graphed_k".
const char* to_string(Mode mode);
/// One line for help texts: what the mode does.
const char* describe(Mode mode);
/// Every mode, simplest first (serial, the baseline, first).
const std::vector<Mode>& workload_modes();
/// Parses a mode name; throws InvalidArgument naming the bad value and every valid one
/// ("mode 'fast' is not valid: expected serial, pipelined, ... or graphed_k").
Mode parse_mode(const std::string& name);
/// "serial, pipelined, graphed, pipelined+graphed or graphed_k": for help texts.
std::string mode_choices();

/// Each stage has a lane and a host thread of its own (kPipelined, kPipelinedGraphed).
bool runs_pipelined(Mode mode);
/// Stages replay CUDA graphs (kGraphed, kPipelinedGraphed, kGraphedK).
bool captures_graphs(Mode mode);

/// Eager steps before a stage captures its graph in the graphed modes: lazy initialization
/// (cuDNN plans, cuBLAS workspaces, optimizer state) happens in them, outside the graph.
constexpr int kGraphWarmupSteps = 3;

/// "a, b or c": for error messages that list what was expected.
std::string join_choices(const std::vector<std::string>& choices);

}  // namespace tandem
