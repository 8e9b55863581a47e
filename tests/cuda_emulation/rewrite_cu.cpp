// rewrite_cu: turns a .cu file into C++ that g++ compiles against the CPU emulation of CUDA,
// at build time (the sources themselves stay as nvcc reads them). Line numbers are kept, and a
// #line directive names the original file, so diagnostics and __LINE__ point at the .cu file.
//
//   rewrite_cu IN.cu OUT.cpp [NAME]
//
// NAME (default IN.cu) is how the output names its source: the build passes the path from the
// repository's root (ops/cuda/x.cu), so the rewritten file is the same in every checkout and a
// compiler cache serves a clone in another folder (docs/building.md).
//
// What it rewrites (see device_prelude.h for what the results call):
//   kernel<T><<<grid, block, bytes, stream>>>(args)
//     -> ::moepeak::cuda_emulation::launcher("kernel<T>", kernel<T>, grid, block, bytes,
//        stream)(args)                      (the kernel may be on the line before the <<<)
//   __shared__ T name[N][M];
//     -> auto& name = ::moepeak::cuda_emulation::static_shared<T[N][M]>(<site key>);
//   extern __shared__ __align__(16) T name[];
//     -> #define name (reinterpret_cast<T*>(::moepeak::cuda_emulation::dynamic_shared()))
//   __global__ void k(...) {
//     -> the same, with a note of k's name first in its body (the kernel coverage log)
// Anything else that looks like launch syntax or a __shared__ declaration it cannot read is an
// error naming the file and line, so a new construct fails the build instead of compiling wrong.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {

int line_of(const std::string& text, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

[[noreturn]] void fail(const std::string& file, const std::string& text, size_t pos,
                       const std::string& what) {
  throw std::runtime_error(file + ":" + std::to_string(line_of(text, pos)) + ": " + what);
}

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Start of the kernel expression that ends just before `end` (identifiers, ::, template args).
size_t kernel_start(const std::string& s, size_t end) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
  for (;;) {
    if (i > 0 && s[i - 1] == '>') {  // template arguments: back to the matching '<'
      int depth = 0;
      do {
        --i;
        if (s[i] == '>') ++depth;
        if (s[i] == '<') --depth;
      } while (i > 0 && depth > 0);
      while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
    }
    const size_t before = i;
    while (i > 0 && ident_char(s[i - 1])) --i;
    if (i == before) return i;
    if (i >= 2 && s[i - 1] == ':' && s[i - 2] == ':') {
      i -= 2;
      continue;
    }
    return i;
  }
}

std::string squash(std::string s) {  // one line, single spaces: the kernel's name in messages
  std::string out;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Whether `pos` is inside a comment or a string or character literal.
bool in_comment_or_literal(const std::string& s, size_t pos) {
  enum { code, line_comment, block_comment, literal } state = code;
  char quote = 0;
  for (size_t i = 0; i < pos; ++i) {
    const char c = s[i], next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (state == code) {
      if (c == '/' && next == '/') {
        state = line_comment;
        ++i;
      } else if (c == '/' && next == '*') {
        state = block_comment;
        ++i;
      } else if (c == '"' || c == '\'') {
        state = literal;
        quote = c;
      }
    } else if (state == line_comment) {
      if (c == '\n') state = code;
    } else if (state == block_comment) {
      if (c == '*' && next == '/') {
        state = code;
        ++i;
      }
    } else if (c == '\\') {
      ++i;  // an escaped character of the literal
    } else if (c == quote) {
      state = code;
    }
  }
  return state != code;
}

std::string rewrite_launches(const std::string& file, std::string s) {
  size_t pos = 0;
  while ((pos = s.find("<<<", pos)) != std::string::npos) {
    if (in_comment_or_literal(s, pos)) {
      pos += 3;
      continue;
    }
    const size_t start = kernel_start(s, pos);
    if (start == pos) fail(file, s, pos, "a <<< launch without a kernel name before it");
    // The configuration ends at the first >>> outside parentheses.
    size_t close = pos + 3;
    int depth = 0;
    for (; close + 2 < s.size(); ++close) {
      if (s[close] == '(') ++depth;
      if (s[close] == ')') --depth;
      if (depth == 0 && s.compare(close, 3, ">>>") == 0) break;
    }
    if (close + 2 >= s.size()) fail(file, s, pos, "a <<< launch without its >>>");
    size_t after = close + 3;
    while (after < s.size() && std::isspace(static_cast<unsigned char>(s[after]))) ++after;
    if (after >= s.size() || s[after] != '(') {
      fail(file, s, pos, "a <<<...>>> launch not followed by its argument list");
    }
    const std::string kernel = s.substr(start, pos - start);
    const std::string name = squash(kernel);
    std::string replaced = "::moepeak::cuda_emulation::launcher(\"" + name + "\", " + kernel +
                           ", " + s.substr(pos + 3, close - pos - 3) + ")";
    s.replace(start, close + 3 - start, replaced);
    pos = start + replaced.size();
  }
  return s;
}

// Marks the start of every __global__ function's body with a note of its name (the kernel
// coverage log, device_prelude.h's note_kernel), on the same line.
std::string note_kernels(std::string s) {
  const std::string note =
      " static const bool moepeak_kernel_noted_ ="
      " ::moepeak::cuda_emulation::note_kernel(__func__); (void)moepeak_kernel_noted_;";
  size_t pos = 0;
  while ((pos = s.find("__global__", pos)) != std::string::npos) {
    if (in_comment_or_literal(s, pos)) {
      pos += 10;
      continue;
    }
    int depth = 0;
    size_t i = pos + 10;
    for (; i < s.size(); ++i) {
      if (s[i] == '(') ++depth;
      if (s[i] == ')') --depth;
      if (depth == 0 && (s[i] == ';' || s[i] == '{')) break;
    }
    if (i < s.size() && s[i] == '{') s.insert(i + 1, note);  // a definition, not a declaration
    pos = i;
  }
  return s;
}

std::string rewrite_shared(const std::string& file, const std::string& s) {
  // extern __shared__ [__align__(n)] TYPE NAME[];
  static const std::regex dynamic_decl(
      R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;)");
  // __shared__ TYPE NAME[..]...;
  static const std::regex static_decl(
      R"(__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:<>,\s]*?)\s+(\w+)((?:\s*\[[^\]\n]+\])+)\s*;)");
  std::string out;
  std::istringstream lines(s);
  std::string line;
  size_t offset = 0;
  while (std::getline(lines, line)) {
    const size_t line_start = offset;
    offset += line.size() + 1;
    std::smatch m;
    if (line.find("__shared__") != std::string::npos) {
      const size_t indent = line.find_first_not_of(" \t");
      if (std::regex_search(line, m, dynamic_decl)) {
        line = line.substr(0, indent) + "#define " + m[2].str() + " (reinterpret_cast<" +
               m[1].str() + "*>(::moepeak::cuda_emulation::dynamic_shared()))";
      } else if (std::regex_search(line, m, static_decl)) {
        line = m.prefix().str() + "auto& " + m[2].str() +
               " = ::moepeak::cuda_emulation::static_shared<" + m[1].str() + m[3].str() +
               ">([] { static const char site = 0; return &site; }());" + m.suffix().str();
      } else if (line.find("//") == std::string::npos ||
                 line.find("//") > line.find("__shared__")) {
        fail(file, s, line_start,
             "a __shared__ declaration the emulation's rewrite cannot read "
             "(one declaration per line: [extern] __shared__ TYPE NAME[...];)");
      }
    }
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: rewrite_cu IN.cu OUT.cpp [NAME]\n");
    return 2;
  }
  const std::string name = argc == 4 ? argv[3] : argv[1];
  try {
    std::ifstream in(argv[1]);
    if (!in) throw std::runtime_error(std::string(argv[1]) + ": cannot read");
    std::stringstream text;
    text << in.rdbuf();
    std::string body = rewrite_shared(name, note_kernels(rewrite_launches(name, text.str())));
    const std::string out_text =
        "// Generated by rewrite_cu from " + name +
        ": do not edit.\n#include \"tests/cuda_emulation/device_prelude.h\"\n"
        "#line 1 \"" +
        name + "\"\n" + body;
    const std::string tmp = std::string(argv[2]) + ".tmp";
    {
      std::ofstream out(tmp);
      out << out_text;
      if (!out) throw std::runtime_error(tmp + ": cannot write");
    }
    if (std::rename(tmp.c_str(), argv[2]) != 0) {
      throw std::runtime_error(std::string(argv[2]) + ": cannot write");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rewrite_cu: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
