//go:build tools

// Package tools pins the helm CLI through this module's go.sum, so every build of
// tools/helm/build.sh fetches exactly the approved version.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
