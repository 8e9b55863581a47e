#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace moepeak {

std::optional<uint64_t> parse_bytes(std::string_view text) {
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skip_space();
  size_t start = i;
  bool seen_dot = false, seen_digit = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    if (text[i] == '.') {
      if (seen_dot) return std::nullopt;
      seen_dot = true;
    } else {
      seen_digit = true;
    }
    ++i;
  }
  if (!seen_digit) return std::nullopt;
  std::string number(text.substr(start, i - start));
  skip_space();
  std::string unit;
  while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) unit += text[i++];
  skip_space();
  if (i != text.size()) return std::nullopt;

  long double scale = 0;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "KiB")
    scale = static_cast<long double>(KiB);
  else if (unit == "MiB")
    scale = static_cast<long double>(MiB);
  else if (unit == "GiB")
    scale = static_cast<long double>(GiB);
  else if (unit == "TiB")
    scale = static_cast<long double>(TiB);
  else if (unit == "KB" || unit == "kB")
    scale = 1e3L;
  else if (unit == "MB")
    scale = 1e6L;
  else if (unit == "GB")
    scale = 1e9L;
  else if (unit == "TB")
    scale = 1e12L;
  else
    return std::nullopt;
  if (seen_dot && scale == 1) return std::nullopt;  // "1.5" bytes means nothing

  long double value = std::strtold(number.c_str(), nullptr) * scale;
  if (!(value >= 0) || value > 1.8e19L) return std::nullopt;
  return static_cast<uint64_t>(std::llround(value));
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < KiB) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

std::string format_gib(uint64_t bytes, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, static_cast<double>(bytes) / GiB);
  return buf;
}

}  // namespace moepeak
