/* ge::AscendString as GE declares it (metadef's external/graph/ascend_string.h), for programs
 * built where CANN's GE headers are not on the include path: shared by adxl/adxl_types.h and
 * llm_datadist/ge_compat.h. Its methods are defined out of line, in libllm_datadist.so (or in
 * CANN's libmetadef.so). GE's own include guard, so GE's header and this one never both
 * declare it. */
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#ifndef INC_EXTERNAL_GRAPH_ASCEND_STRING_H_
#define INC_EXTERNAL_GRAPH_ASCEND_STRING_H_  // GE's guard: this is ge::AscendString
namespace ge {
using char_t = char;
class AscendStringImpl;

/* GE's string type, declared as GE declares it: an immutable, shared string whose methods are
 * defined out of line (in libllm_datadist.so here, or CANN's libmetadef.so). */
class AscendString {
 public:
  AscendString() = default;
  ~AscendString() = default;
  AscendString(const char_t *const name);  // NOLINT: implicit, as GE's
  AscendString(const char_t *const name, size_t length);
  const char_t *GetString() const;
  size_t GetLength() const;
  size_t Find(const AscendString &ascend_string) const;
  size_t Hash() const;
  bool operator<(const AscendString &d) const;
  bool operator>(const AscendString &d) const;
  bool operator<=(const AscendString &d) const;
  bool operator>=(const AscendString &d) const;
  bool operator==(const AscendString &d) const;
  bool operator!=(const AscendString &d) const;
  bool operator==(const char_t *const d) const;
  bool operator!=(const char_t *const d) const;

 private:
  std::shared_ptr<std::string> name_;
  friend class AscendStringImpl;
};
}  // namespace ge

namespace std {
template <>
struct hash<ge::AscendString> {
  size_t operator()(const ge::AscendString &name) const { return name.Hash(); }
};
}  // namespace std
#endif  // INC_EXTERNAL_GRAPH_ASCEND_STRING_H_
