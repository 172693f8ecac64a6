// The graph builders of the cuDNN fusion probe: one per pattern (A-H), each with the variants the probe
// tries in order when an earlier one is not supported.
#include "common.h"

#include <memory>
#include <string>
#include <vector>

namespace fusion_probe {

namespace {

// Channels-last strides for an N,C,H,W tensor (and K,C,R,S filters: the same formula).
std::vector<int64_t> nhwc_stride(int64_t c, int64_t h, int64_t w) { return {c * h * w, 1, w * c, c}; }

// The activations' and filters' type of the graph being built: bf16 (the training's), or fp16 in the
// variants that ask whether an unsupported bf16 pattern exists for fp16 (the specialized engines' type).
fe::DataType_t g_io = fe::DataType_t::BFLOAT16;

std::shared_ptr<Graph> new_graph(fe::DataType_t intermediate = fe::DataType_t::FLOAT) {
    auto g = std::make_shared<Graph>();
    g->set_io_data_type(g_io)
        .set_intermediate_data_type(intermediate)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

TensorPtr activation(Graph& g, const char* name, int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_dim({n, c, h, w})
                        .set_stride(nhwc_stride(c, h, w))
                        .set_data_type(g_io));
}

TensorPtr filter(Graph& g, const char* name, const ConvShape& s) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_dim({s.k, s.c, s.r, s.s})
                        .set_stride(nhwc_stride(s.c, s.r, s.s))
                        .set_data_type(g_io));
}

TensorPtr per_channel(Graph& g, const char* name, int64_t c, fe::DataType_t dt) {
    return g.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim({1, c, 1, 1}).set_stride({c, 1, c, c}).set_data_type(dt));
}

void mark_per_channel_output(const TensorPtr& t, int64_t c) {
    t->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim({1, c, 1, 1}).set_stride({c, 1, c, c});
}

void mark_activation_output(const TensorPtr& t, int64_t n, int64_t c, int64_t h, int64_t w) {
    t->set_output(true).set_data_type(g_io).set_dim({n, c, h, w}).set_stride(nhwc_stride(c, h, w));
}

double conv_flops(const ConvShape& s) { return 2.0 * s.n * s.k * s.h * s.w * s.c * s.r * s.s; }

fe::graph::Pointwise_attributes pw(fe::PointwiseMode_t mode, const char* name) {
    return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(
        fe::DataType_t::FLOAT);
}

// X -> X * scale + bias -> ReLU, per channel (the batch norm's equivalent scale and bias).
TensorPtr scale_bias_relu(Graph& g, const TensorPtr& x, const TensorPtr& scale, const TensorPtr& bias) {
    auto scaled = g.pointwise(x, scale, pw(fe::PointwiseMode_t::MUL, "sbr_scale"));
    auto biased = g.pointwise(scaled, bias, pw(fe::PointwiseMode_t::ADD, "sbr_bias"));
    return g.pointwise(biased, pw(fe::PointwiseMode_t::RELU_FWD, "sbr_relu"));
}

// scale_bias_relu on X with the buffers' per-channel scale and bias (of type sb_type) bound in `out`:
// the prologue of C and G.
TensorPtr scale_bias_relu_prologue(Graph& g, const TensorPtr& x, int64_t c, fe::DataType_t sb_type,
                                   const Buffers& b, BuiltGraph& out) {
    auto S = per_channel(g, "scale", c, sb_type);
    auto B = per_channel(g, "bias", c, sb_type);
    const bool f32 = sb_type == fe::DataType_t::FLOAT;
    out.bindings.push_back({S, f32 ? static_cast<void*>(b.chf[kScale]) : b.chb[0]});
    out.bindings.push_back({B, f32 ? static_cast<void*>(b.chf[kBias]) : b.chb[1]});
    return scale_bias_relu(g, x, S, B);
}

}  // namespace

Builder make_fprop_builder(const ConvShape& s, const Buffers& b, bool with_genstats, bool with_prologue) {
    return [&s, &b, with_genstats, with_prologue](int variant, std::string& vname, BuiltGraph& out) -> bool {
        fe::DataType_t sb_type = fe::DataType_t::BFLOAT16;
        g_io = fe::DataType_t::BFLOAT16;
        int reductions = 0;  // B's variants 1 and 2: the statistics as the runtime fusion's reductions
        if (with_prologue) {
            if (variant == 0) {
                vname = "scale/bias bf16";
            } else if (variant == 1) {
                vname = "scale/bias fp32";
                sb_type = fe::DataType_t::FLOAT;
            } else if (variant == 2) {
                vname = "fp16 activations, scale/bias fp16";
                g_io = sb_type = fe::DataType_t::HALF;
            } else {
                return false;
            }
        } else if (with_genstats) {
            if (variant == 0) {
                vname = "";
            } else if (variant == 1) {
                vname = "bf16, sum and sum of squares as two ADD reductions";
                reductions = 2;
            } else if (variant == 2) {
                vname = "bf16, the sum alone as an ADD reduction";
                reductions = 1;
            } else if (variant == 3) {
                vname = "fp16 genstats";
                g_io = fe::DataType_t::HALF;
            } else {
                return false;
            }
        } else {
            if (variant != 0) return false;
            vname = "";
        }
        auto g = new_graph();
        g->set_name(with_prologue ? "sbr_conv_genstats" : (with_genstats ? "conv_genstats" : "conv_fprop"));
        auto X = activation(*g, "X", s.n, s.c, s.h, s.w);
        auto W = filter(*g, "W", s);
        out.bindings = {{X, b.act[0]}, {W, b.wt[0]}};
        TensorPtr conv_in = X;
        if (with_prologue) conv_in = scale_bias_relu_prologue(*g, X, s.c, sb_type, b, out);
        auto conv = fe::graph::Conv_fprop_attributes()
                        .set_name("fprop")
                        .set_padding({s.pad, s.pad})
                        .set_stride({1, 1})
                        .set_dilation({1, 1});
        auto Y = g->conv_fprop(conv_in, W, conv);
        mark_activation_output(Y, s.n, s.k, s.h, s.w);
        out.bindings.push_back({Y, b.act[1]});
        out.y = Y;
        if (reductions > 0) {
            auto add = [&](const TensorPtr& t, const char* name) {
                return g->reduction(t, fe::graph::Reduction_attributes()
                                           .set_name(name)
                                           .set_mode(fe::ReductionMode_t::ADD)
                                           .set_compute_data_type(fe::DataType_t::FLOAT));
            };
            auto SUM = add(Y, "sum");
            mark_per_channel_output(SUM, s.k);
            out.bindings.push_back({SUM, b.chf[kOut0]});
            out.sum = SUM;
            if (reductions == 2) {
                auto YY = g->pointwise(Y, Y, pw(fe::PointwiseMode_t::MUL, "square"));
                auto SQ = add(YY, "sum_of_squares");
                mark_per_channel_output(SQ, s.k);
                out.bindings.push_back({SQ, b.chf[kOut0 + 1]});
                out.sq_sum = SQ;
            }
        } else if (with_genstats) {
            auto [SUM, SQ] = g->genstats(Y, fe::graph::Genstats_attributes().set_name("genstats"));
            mark_per_channel_output(SUM, s.k);
            mark_per_channel_output(SQ, s.k);
            out.bindings.push_back({SUM, b.chf[kOut0]});
            out.bindings.push_back({SQ, b.chf[kOut0 + 1]});
            out.sum = SUM;
            out.sq_sum = SQ;
        }
        out.graph = g;
        out.flops = conv_flops(s);
        out.out_bytes = 2.0 * s.n * s.k * s.h * s.w;
        return true;
    };
}

Builder make_dgrad_builder(const ConvShape& s, const Buffers& b, bool fused) {
    return [&s, &b, fused](int variant, std::string& vname, BuiltGraph& out) -> bool {
        if (!fused && variant != 0) return false;
        if (fused && variant > 2) return false;
        g_io = variant == 2 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
        auto g = new_graph();
        g->set_name(fused ? "dgrad_drelu_dbn" : "conv_dgrad");
        auto DY = activation(*g, "DY", s.n, s.k, s.h, s.w);
        auto W = filter(*g, "W", s);
        out.bindings = {{DY, b.act[1]}, {W, b.wt[0]}};
        auto dgrad = fe::graph::Conv_dgrad_attributes()
                         .set_name("dgrad")
                         .set_padding({s.pad, s.pad})
                         .set_stride({1, 1})
                         .set_dilation({1, 1});
        auto DX = g->conv_dgrad(DY, W, dgrad);
        DX->set_dim({s.n, s.c, s.h, s.w}).set_stride(nhwc_stride(s.c, s.h, s.w));
        if (!fused) {
            vname = "";
            mark_activation_output(DX, s.n, s.c, s.h, s.w);
            out.bindings.push_back({DX, b.act[2]});
        } else {
            // X is the previous convolution's output before its batch norm; M, V, S, B that norm's saved
            // mean, inverse deviation, gamma and beta (fp32, as in the frontend's own dgrad+drelu+dbn
            // sample). The ReLU's gradient needs the norm's output, which variant 0 rebuilds from X inside
            // the graph; variant 1 reads a stored ReLU output instead, the form a framework that keeps its
            // activations would use.
            auto X = activation(*g, "X_prenorm", s.n, s.c, s.h, s.w);
            auto M = per_channel(*g, "mean", s.c, fe::DataType_t::FLOAT);
            auto V = per_channel(*g, "inv_std", s.c, fe::DataType_t::FLOAT);
            auto S = per_channel(*g, "gamma", s.c, fe::DataType_t::FLOAT);
            out.bindings.push_back({X, b.act[0]});
            out.bindings.push_back({M, b.chf[kMean]});
            out.bindings.push_back({V, b.chf[kInvVar]});
            out.bindings.push_back({S, b.chf[kScale]});
            TensorPtr relu_ref;
            if (variant == 0 || variant == 2) {
                vname = variant == 0 ? "bn output rebuilt from X, mean, inv_std, gamma, beta"
                                     : "fp16, bn output rebuilt from X";
                auto B = per_channel(*g, "beta", s.c, fe::DataType_t::FLOAT);
                out.bindings.push_back({B, b.chf[kBias]});
                auto centred = g->pointwise(X, M, pw(fe::PointwiseMode_t::SUB, "bn_sub_mean"));
                auto normed = g->pointwise(centred, V, pw(fe::PointwiseMode_t::MUL, "bn_mul_inv_std"));
                auto scaled = g->pointwise(normed, S, pw(fe::PointwiseMode_t::MUL, "bn_mul_gamma"));
                relu_ref = g->pointwise(scaled, B, pw(fe::PointwiseMode_t::ADD, "bn_add_beta"));
            } else {
                vname = "stored relu output";
                // act[1] is taken by DY and act[2] by the ReLU gradient, so the stored output shares X's
                // buffer: the values do not matter for timing.
                relu_ref = activation(*g, "relu_out", s.n, s.c, s.h, s.w);
                out.bindings.push_back({relu_ref, b.act[0]});
            }
            auto dRelu = g->pointwise(DX, relu_ref, pw(fe::PointwiseMode_t::RELU_BWD, "drelu"));
            mark_activation_output(dRelu, s.n, s.c, s.h, s.w);
            out.bindings.push_back({dRelu, b.act[2]});
            auto outs = g->dbn_weight(dRelu, X, M, V, S, fe::graph::DBN_weight_attributes().set_name("dbn_weight"));
            // outs: dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias
            for (int i = 0; i < 5; ++i) {
                mark_per_channel_output(outs[i], s.c);
                out.bindings.push_back({outs[i], b.chf[kOut0 + i]});
            }
        }
        out.graph = g;
        out.flops = conv_flops(s);
        out.out_bytes = 2.0 * s.n * s.c * s.h * s.w;
        return true;
    };
}

Builder make_dgrad_sums_builder(const ConvShape& s, const Buffers& b) {
    return [&s, &b](int variant, std::string& vname, BuiltGraph& out) -> bool {
        if (variant > 1) return false;
        g_io = fe::DataType_t::BFLOAT16;
        auto g = new_graph();
        g->set_name("dgrad_drelu_sums");
        auto DY = activation(*g, "DY", s.n, s.k, s.h, s.w);
        auto W = filter(*g, "W", s);
        out.bindings = {{DY, b.act[1]}, {W, b.wt[0]}};
        auto DX = g->conv_dgrad(DY, W,
                                fe::graph::Conv_dgrad_attributes()
                                    .set_name("dgrad")
                                    .set_padding({s.pad, s.pad})
                                    .set_stride({1, 1})
                                    .set_dilation({1, 1}));
        DX->set_dim({s.n, s.c, s.h, s.w}).set_stride(nhwc_stride(s.c, s.h, s.w));
        // The stored ReLU output (the batch norm's y) and its input x share one buffer here: the values
        // do not matter for timing, and act[1] / act[2] hold dY and dZ.
        auto Y = activation(*g, "relu_out", s.n, s.c, s.h, s.w);
        auto X = activation(*g, "x", s.n, s.c, s.h, s.w);
        auto M = per_channel(*g, "mean", s.c, fe::DataType_t::FLOAT);
        out.bindings.push_back({Y, b.act[0]});
        out.bindings.push_back({X, b.act[0]});
        out.bindings.push_back({M, b.chf[kMean]});
        auto DZ = g->pointwise(DX, Y, pw(fe::PointwiseMode_t::RELU_BWD, "drelu"));
        mark_activation_output(DZ, s.n, s.c, s.h, s.w);
        out.bindings.push_back({DZ, b.act[2]});
        auto add = [&](const TensorPtr& t, const char* name) {
            auto r = g->reduction(t, fe::graph::Reduction_attributes()
                                         .set_name(name)
                                         .set_mode(fe::ReductionMode_t::ADD)
                                         .set_compute_data_type(fe::DataType_t::FLOAT));
            mark_per_channel_output(r, s.c);
            return r;
        };
        out.bindings.push_back({add(DZ, "sum_dz"), b.chf[kOut0]});
        if (variant == 0) {
            vname = "bf16, sum dz and sum dz*(x - mean)";
            auto XM = g->pointwise(X, M, pw(fe::PointwiseMode_t::SUB, "x_minus_mean"));
            auto P = g->pointwise(DZ, XM, pw(fe::PointwiseMode_t::MUL, "dz_xmu"));
            out.bindings.push_back({add(P, "sum_dz_xmu"), b.chf[kOut0 + 1]});
        } else {
            vname = "bf16, sum dz alone";
        }
        out.graph = g;
        out.flops = conv_flops(s);
        out.out_bytes = 2.0 * s.n * s.c * s.h * s.w;
        return true;
    };
}

Builder make_wgrad_builder(const ConvShape& s, const Buffers& b, bool with_prologue) {
    return [&s, &b, with_prologue](int variant, std::string& vname, BuiltGraph& out) -> bool {
        fe::DataType_t sb_type = fe::DataType_t::BFLOAT16;
        fe::DataType_t inter = fe::DataType_t::FLOAT;
        g_io = fe::DataType_t::BFLOAT16;
        if (with_prologue) {
            if (variant == 0) {
                vname = "scale/bias bf16, intermediates fp32";
            } else if (variant == 1) {
                vname = "scale/bias bf16, intermediates bf16";
                inter = fe::DataType_t::BFLOAT16;
            } else if (variant == 2) {
                vname = "scale/bias fp32, intermediates fp32";
                sb_type = fe::DataType_t::FLOAT;
            } else if (variant == 3) {
                // Whether the weight gradient can take the batch norm's output from its prologue
                // in fp16 (the type of the specialized engines that run the other fp16 patterns):
                // if it can, the forward need not write the inner batch norms' outputs at all.
                vname = "fp16 activations, scale/bias fp16";
                g_io = sb_type = fe::DataType_t::HALF;
            } else {
                return false;
            }
        } else {
            if (variant != 0) return false;
            vname = "";
        }
        auto g = new_graph(inter);
        g->set_name(with_prologue ? "sbr_wgrad" : "conv_wgrad");
        auto X = activation(*g, "X", s.n, s.c, s.h, s.w);
        auto DY = activation(*g, "DY", s.n, s.k, s.h, s.w);
        out.bindings = {{X, b.act[0]}, {DY, b.act[1]}};
        TensorPtr conv_in = X;
        if (with_prologue) conv_in = scale_bias_relu_prologue(*g, X, s.c, sb_type, b, out);
        auto wgrad = fe::graph::Conv_wgrad_attributes()
                         .set_name("wgrad")
                         .set_padding({s.pad, s.pad})
                         .set_stride({1, 1})
                         .set_dilation({1, 1});
        auto DW = g->conv_wgrad(DY, conv_in, wgrad);
        DW->set_output(true)
            .set_data_type(g_io)
            .set_dim({s.k, s.c, s.r, s.s})
            .set_stride(nhwc_stride(s.c, s.r, s.s));
        out.bindings.push_back({DW, b.wt[1]});
        out.graph = g;
        out.flops = conv_flops(s);
        out.out_bytes = 2.0 * s.k * s.c * s.r * s.s;
        return true;
    };
}

Builder make_finalize_builder(const FinalizeShape& f, const Buffers& b) {
    return [&f, &b](int variant, std::string& vname, BuiltGraph& out) -> bool {
        if (variant != 0) return false;
        vname = "";
        auto g = std::make_shared<Graph>();
        g->set_io_data_type(fe::DataType_t::FLOAT)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT)
            .set_name("bn_finalize");
        const int64_t c = f.c;
        auto sum = per_channel(*g, "sum", c, fe::DataType_t::FLOAT);
        auto sq = per_channel(*g, "sq_sum", c, fe::DataType_t::FLOAT);
        auto gamma = per_channel(*g, "gamma", c, fe::DataType_t::FLOAT);
        auto beta = per_channel(*g, "beta", c, fe::DataType_t::FLOAT);
        auto run_mean = per_channel(*g, "running_mean", c, fe::DataType_t::FLOAT);
        auto run_var = per_channel(*g, "running_var", c, fe::DataType_t::FLOAT);
        // Scalars passed by value (the single-argument Tensor_attributes constructors).
        auto eps = g->tensor(fe::graph::Tensor_attributes(1e-5f));
        auto momentum = g->tensor(fe::graph::Tensor_attributes(0.1f));
        auto count = g->tensor(fe::graph::Tensor_attributes(static_cast<int64_t>(f.nhw)));
        auto attrs = fe::graph::BN_finalize_attributes().set_name("bn_finalize").set_previous_running_stats(
            run_mean, run_var, momentum);
        auto outs = g->bn_finalize(sum, sq, gamma, beta, eps, count, attrs);
        // outs: eq_scale, eq_bias, saved_mean, saved_inv_variance, next_running_mean, next_running_var
        out.bindings = {{sum, b.chf[kSum]},          {sq, b.chf[kSqSum]},         {gamma, b.chf[kScale]},
                        {beta, b.chf[kBias]},        {run_mean, b.chf[kRunMean]}, {run_var, b.chf[kRunVar]}};
        for (int i = 0; i < 6; ++i) {
            if (!outs[i]) throw StepFailure("bn_finalize: output " + std::to_string(i) + " missing");
            mark_per_channel_output(outs[i], c);
            out.bindings.push_back({outs[i], b.chf[kOut0 + i]});
        }
        out.graph = g;
        return true;
    };
}

}  // namespace fusion_probe
