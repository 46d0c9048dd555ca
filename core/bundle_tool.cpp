// bitship-bundle: packs bitcode slices into a bundle and writes the C++ that embeds it and
// exposes one bitship::Kernel handle per entry point. Run by bitship_add_kernels() at build time.
//
//   bitship-bundle --name demo --namespace demo_kernels --nm llvm-nm-19
//                  --slice x86_64-unknown-linux-gnu:x86-64:19.1.7:/path/x86_64.bc
//                  --out-bundle demo.bundle --out-cpp demo_bundle.cpp --out-hpp demo.hpp

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <bitship/bundle.hpp>

namespace {

struct SliceArg {
    std::string triple, cpu, version, path;
};

std::vector<std::byte> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

// Functions the bitcode defines with external linkage: the kernel entry points.
std::vector<std::string> defined_functions(const std::string& nm, const std::string& bc) {
    auto cmd = fmt::format("'{}' --defined-only --extern-only '{}'", nm, bc);
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    if (!pipe) throw std::runtime_error("cannot run " + cmd);
    std::vector<std::string> names;
    char line[4096];
    while (fgets(line, sizeof line, pipe.get())) {
        std::istringstream fields(line);
        std::string a, b, c;
        fields >> a >> b >> c;
        // "---------------- T name" (address, type, name) or "T name" when no address is printed.
        std::string type = c.empty() ? a : b, name = c.empty() ? b : c;
        if (type == "T" && !name.empty()) names.push_back(name);
    }
    return names;
}

bitship::LlvmVersion parse_version(const std::string& s) {
    bitship::LlvmVersion v;
    unsigned a = 0, b = 0, c = 0;
    if (std::sscanf(s.c_str(), "%u.%u.%u", &a, &b, &c) < 1) throw std::runtime_error("bad LLVM version '" + s + "'");
    v.major = static_cast<std::uint16_t>(a);
    v.minor = static_cast<std::uint16_t>(b);
    v.patch = static_cast<std::uint16_t>(c);
    return v;
}

bool is_identifier(const std::string& s) {
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
    for (char ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return false;
    return true;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"Packs LLVM bitcode slices into a bitship bundle and generates its C++ handles"};
    std::string name, ns, nm = "llvm-nm-19", out_bundle, out_cpp, out_hpp;
    std::vector<std::string> slice_specs;
    app.add_option("--name", name, "bundle name (a C identifier)")->required();
    app.add_option("--namespace", ns, "C++ namespace of the generated handles")->required();
    app.add_option("--nm", nm, "llvm-nm used to list each slice's entry points")->capture_default_str();
    app.add_option("--slice", slice_specs, "TRIPLE:CPU:LLVM_VERSION:BITCODE_FILE, once per architecture")->required();
    app.add_option("--out-bundle", out_bundle, "where to write the bundle")->required();
    app.add_option("--out-cpp", out_cpp, "where to write the embedding source")->required();
    app.add_option("--out-hpp", out_hpp, "where to write the header with kernel handles")->required();
    CLI11_PARSE(app, argc, argv);

    try {
        if (!is_identifier(name)) throw std::runtime_error("--name '" + name + "' is not a C identifier");
        std::vector<SliceArg> slices;
        for (const auto& spec : slice_specs) {
            SliceArg s;
            std::istringstream parts(spec);
            std::getline(parts, s.triple, ':');
            std::getline(parts, s.cpu, ':');
            std::getline(parts, s.version, ':');
            std::getline(parts, s.path);
            if (s.path.empty()) throw std::runtime_error("--slice '" + spec + "' is not TRIPLE:CPU:VERSION:FILE");
            slices.push_back(s);
        }
        // Every slice must export the same entry points, or a kernel would exist on one
        // architecture and not another.
        std::vector<std::string> entries;
        std::vector<std::vector<std::byte>> bitcode;
        std::vector<bitship::SliceInput> inputs;
        for (std::size_t i = 0; i < slices.size(); ++i) {
            auto names = defined_functions(nm, slices[i].path);
            if (i == 0) entries = names;
            else if (std::set(names.begin(), names.end()) != std::set(entries.begin(), entries.end()))
                throw std::runtime_error(fmt::format("slice {} defines other functions than slice {}",
                                                     slices[i].triple, slices[0].triple));
            bitcode.push_back(read_file(slices[i].path));
        }
        if (entries.empty()) throw std::runtime_error("the kernels define no external function");
        for (std::size_t i = 0; i < slices.size(); ++i)
            inputs.push_back({slices[i].triple, slices[i].cpu, "clang " + slices[i].version,
                              parse_version(slices[i].version), bitcode[i]});
        auto bundle = bitship::write_bundle(entries, inputs);
        {
            std::ofstream out(out_bundle, std::ios::binary);
            out.write(reinterpret_cast<const char*>(bundle.data()), static_cast<std::streamsize>(bundle.size()));
            if (!out) throw std::runtime_error("cannot write " + out_bundle);
        }
        {
            std::ofstream out(out_cpp);
            out << "// Generated by bitship-bundle from bundle '" << name << "'. Do not edit.\n"
                << "#include <cstddef>\n#include <span>\n\n"
                << "namespace {\nalignas(16) const unsigned char kBundle[" << bundle.size() << "] = {";
            for (std::size_t i = 0; i < bundle.size(); ++i)
                out << (i % 24 == 0 ? "\n    " : "") << static_cast<unsigned>(bundle[i]) << ",";
            out << "\n};\n} // namespace\n\nnamespace " << ns << " {\n"
                << "std::span<const std::byte> bundle() noexcept { return std::as_bytes(std::span(kBundle)); }\n"
                << "} // namespace " << ns << "\n";
            if (!out) throw std::runtime_error("cannot write " + out_cpp);
        }
        {
            std::ofstream out(out_hpp);
            out << "// Generated by bitship-bundle from bundle '" << name << "'. Do not edit.\n"
                << "#pragma once\n#include <cstddef>\n#include <span>\n\n#include <bitship/client.hpp>\n\n"
                << "namespace " << ns << " {\n\n"
                << "/// The whole bundle: " << bundle.size() << " bytes, slices:";
            for (const auto& s : slices) out << " " << s.triple;
            out << ".\nstd::span<const std::byte> bundle() noexcept;\n\n";
            for (const auto& e : entries) {
                if (!is_identifier(e)) continue;
                out << "/// Kernel `" << e << "` of bundle '" << name << "'.\n"
                    << "inline constexpr bitship::Kernel " << e << "{&bundle, \"" << e << "\"};\n";
            }
            out << "\n} // namespace " << ns << "\n";
            if (!out) throw std::runtime_error("cannot write " + out_hpp);
        }
    } catch (const std::exception& e) {
        std::cerr << "bitship-bundle: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
