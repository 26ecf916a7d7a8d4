package twins

import (
	"encoding/base64"
	"strconv"
)

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
