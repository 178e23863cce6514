// A check of CDI spec files against the Container Device Interface specification (the fields and
// version rules of spec versions 0.1.0 to 0.8.0), as a runtime's CDI cache applies them when it
// loads a spec. Written from the specification, apart from the plugin's code, so a test that runs
// the plugin's specs through it can fail.
//
//  - Fields: cdiVersion, kind and devices are required; no field outside the specification.
//  - kind "<vendor>/<class>": each starts with a letter, ends with a letter or digit, and holds
//    letters, digits, '_', '-' and '.' between.
//  - devices: at least one; names unique, starting and ending with a letter or digit, with
//    '_', '-', '.' and ':' between; each device's containerEdits non-empty.
//  - containerEdits: env entries "NAME=value" with a non-empty name; mounts with hostPath and
//    containerPath; deviceNodes with a path, a type among b, c, u, p and permissions among r, w,
//    m; hooks named as OCI hooks, with a path and valid env.
//  - Versions: cdiVersion is a released version, and at least the version the spec's features
//    need: a mount type 0.4.0; a device name starting with a digit or a device node hostPath
//    0.5.0; annotations or a '.' in the class 0.6.0; additionalGids or intelRdt 0.7.0.
#pragma once

#include <string>
#include <string_view>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::testing {

// The parsed spec, or an error naming the first rule it breaks.
Result<Json> validate_cdi_spec(std::string_view text);

// The minimum CDI version a parsed, otherwise valid spec needs ("0.3.0" when nothing newer).
std::string minimum_cdi_version(const Json& spec);

}  // namespace nvshare::testing
