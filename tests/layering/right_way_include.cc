// Must compile: the same target shape as wrong_way_include.cc, with headers
// of its own layer and the ones below only, so that the failure of the
// other one is the wrong-way include and nothing else.
#include "knnd/faiss/vector_math.h"
#include "knnd/storage/vector_io.h"

int main() { return 0; }
