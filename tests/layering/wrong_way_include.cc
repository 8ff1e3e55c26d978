// Must not compile: storage (a lower layer) includes a header of serving (a
// higher one). tests/CMakeLists.txt builds it and expects the build to fail,
// which proves that the layers' include roots keep each layer to the ones
// below it.
#include "knnd/serving/batcher.h"
#include "knnd/storage/vector_io.h"

int main() { return 0; }
