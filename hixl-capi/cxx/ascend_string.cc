// ge::AscendString's out-of-line methods, as GE declares them (graph/ascend_string.h; declared
// by adxl/adxl_types.h where CANN's headers are not there): what a program compiled against
// CANN's GE header needs from CANN's libmetadef.so, here in libllm_datadist.so for hosts without
// CANN. A null string (default-constructed, or built from a null pointer) reads as "", equals only
// another null one (and a null char pointer), orders before every other string and finds nothing.
// Where a program loads libmetadef.so before this library, its definitions are the ones used,
// for every string alike (nothing here reads a string's members inline).
#include "adxl/adxl_types.h"

#include <string>

namespace ge {
namespace {
// <0, 0, >0, a null string ordering first
int Compare(const std::shared_ptr<std::string> &a, const std::shared_ptr<std::string> &b) {
  if (a == nullptr || b == nullptr) return (a != nullptr) - (b != nullptr);
  return a->compare(*b);
}
}  // namespace

AscendString::AscendString(const char_t *const name) {
  if (name != nullptr) name_ = std::make_shared<std::string>(name);
}

AscendString::AscendString(const char_t *const name, size_t length) {
  if (name != nullptr) name_ = std::make_shared<std::string>(name, length);
}

const char_t *AscendString::GetString() const { return name_ == nullptr ? "" : name_->c_str(); }

size_t AscendString::GetLength() const { return name_ == nullptr ? 0 : name_->size(); }

size_t AscendString::Find(const AscendString &ascend_string) const {
  if (name_ == nullptr || ascend_string.name_ == nullptr) return std::string::npos;
  return name_->find(*ascend_string.name_);
}

size_t AscendString::Hash() const {
  return std::hash<std::string>()(name_ == nullptr ? std::string() : *name_);
}

bool AscendString::operator<(const AscendString &d) const { return Compare(name_, d.name_) < 0; }
bool AscendString::operator>(const AscendString &d) const { return Compare(name_, d.name_) > 0; }
bool AscendString::operator<=(const AscendString &d) const { return Compare(name_, d.name_) <= 0; }
bool AscendString::operator>=(const AscendString &d) const { return Compare(name_, d.name_) >= 0; }
bool AscendString::operator==(const AscendString &d) const { return Compare(name_, d.name_) == 0; }
bool AscendString::operator!=(const AscendString &d) const { return Compare(name_, d.name_) != 0; }

bool AscendString::operator==(const char_t *const d) const {
  if (name_ == nullptr || d == nullptr) return name_ == nullptr && d == nullptr;
  return name_->compare(d) == 0;
}

bool AscendString::operator!=(const char_t *const d) const { return !(*this == d); }
}  // namespace ge
